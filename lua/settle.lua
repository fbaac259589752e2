-- settle.lua: complete a batch of handled messages in one atomic step (standalone Redis).
-- For each item: store the outcome in its idempotency record if the fence still matches
-- (as complete.lua), and only then run the item's follow-up commands: publish the reply,
-- file a dead letter or a delayed retry, XACK + XDEL the inbox entry. On a Cluster the
-- keys live in different slots, so the runtime uses complete.lua and a pipeline instead.
--
-- KEYS: every key the batch touches (idempotency records, reply streams, dead-letter
--       streams, the delayed zset, inbox streams); items refer to them by index
-- ARGV[1] ttl_ms of idempotency records and reply streams: integer 1..31536000000 (365 days)
-- ARGV[2] the inbox consumer group: 1..1024 bytes
-- ARGV[3] number of items, then for each item:
--   idem key index (0 = nothing to complete), fence (integer 1..2^53), status (succeeded |
--   failed | retrying | expired | dead), reply bytes, mode ('done': store the reply, later
--   deliveries replay it | 'release': the key may run again), error text (fence, status
--   and mode are read only with an idem key: anything goes with index 0), reply stream
--   index (0 = publish no reply), inbox stream index (0 = no ack), entry id (a stream id
--   'ms-seq' or 'ms', read only with an inbox), number of extra commands, then each extra
--   command: name, key index (1..#KEYS), number of arguments (0..1000), arguments...
--   Extra commands allowed, in these forms only:
--     XADD [MAXLEN [~|=] <integer 0..2^53>] * field value [field value ...]
--     ZADD score member [score member ...]  (scores: finite decimal numbers, e.g. 12 or 1.5)
-- A key index is 0..#KEYS where 0 is allowed (as said), 1..#KEYS otherwise. Integers are
-- plain decimal digits without sign or leading zero. The items must use ARGV exactly:
-- #ARGV = 3 + what the items describe.
--
-- Everything is checked before the first write, so a refused batch writes nothing (Redis
-- does not roll a script back): every count, index, number and name above, and the type
-- of every key against each use of it (idem key: a hash; reply stream, inbox, XADD: a
-- stream; ZADD: a sorted set; or absent), including one key used as two types.
--
-- Returns one code per item: 1 settled (reply published, extra commands run, entry
-- acked and deleted); 0 fenced: another owner claimed the key since, nothing was written
-- for this item
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError), e.g. 'reach: bad extra command 1 of item 2 (ARGV[14]) DEL: want
--         XADD or ZADD'. Only a bug or a hostile caller gets one: the runtime never sends
--         such a call.
local MAX_TTL, MAX_INT, MAX_CMD_ARGS = 31536000000, 9007199254740992, 1000
local STATUSES = {succeeded = true, failed = true, retrying = true, expired = true, dead = true}
local MODES = {done = true, release = true}
local U64 = '18446744073709551615'

local function show(v)
  return (string.gsub(string.sub(tostring(v), 1, 40), '[^%w%.%+%-_ ]', '?'))
end

-- A plain decimal integer as the runtime sends it ('0' or digits without a leading zero),
-- in lo..hi; nil for anything else. Parsed once per distinct string: the same small
-- numbers (indexes, counts) come back in every item of a batch.
local parsed = {}
local function int(v, lo, hi)
  local n = parsed[v]
  if n == nil then
    n = false
    if #v <= 16 and (v == '0' or string.find(v, '^[1-9]%d*$')) then n = tonumber(v) end
    parsed[v] = n
  end
  if not n or n < lo or n > hi then return nil end
  return n
end

-- A stream entry id XACK and XDEL accept: 'ms-seq' or 'ms', each part 0..2^64-1 (a part
-- of 20 digits is compared with 2^64-1 as a string).
local function stream_id_ok(v)
  local dash = string.find(v, '-', 1, true)
  if not dash then
    return #v >= 1 and string.find(v, '^%d+$') ~= nil and (#v < 20 or (#v == 20 and v <= U64))
  end
  local ms, seq = dash - 1, #v - dash
  if ms < 1 or seq < 1 or ms > 20 or seq > 20 or not string.find(v, '^%d+%-%d+$') then
    return false
  end
  return (ms < 20 or string.sub(v, 1, 20) <= U64) and (seq < 20 or string.sub(v, dash + 1) <= U64)
end

-- A finite score ZADD parses as Redis does and Lua agrees with.
local function score_ok(v)
  return #v <= 24 and (string.find(v, '^%-?%d+$') or string.find(v, '^%-?%d+%.%d+$')) ~= nil
end

-- The arguments of one extra command, ARGV[a..last]; nil when well formed, else why not.
local function xadd_args(a, last)
  if a <= last and string.upper(ARGV[a]) == 'MAXLEN' then
    a = a + 1
    if a <= last and (ARGV[a] == '~' or ARGV[a] == '=') then a = a + 1 end
    if a > last or not int(ARGV[a], 0, MAX_INT) then
      return 'XADD MAXLEN: want an integer 0..2^53'
    end
    a = a + 1
  end
  if a > last or ARGV[a] ~= '*' then return "XADD: want the entry id '*' (after MAXLEN, if any)" end
  local n = last - a
  if n < 2 or n % 2 ~= 0 then return 'XADD: want field value pairs after *' end
  return nil
end

local function zadd_args(a, last)
  local n = last - a + 1
  if n < 2 or n % 2 ~= 0 then return 'ZADD: want score member pairs (no options)' end
  for s = a, last, 2 do
    if not score_ok(ARGV[s]) then return 'ZADD score ' .. show(ARGV[s]) .. ': want a finite decimal number' end
  end
  return nil
end

local COMMANDS = {XADD = {'stream', xadd_args}, ZADD = {'zset', zadd_args}}

-- ' of item 2', ' of extra command 1 of item 2': built only for an error message.
local function where(item, c)
  if c then return ' of extra command ' .. c .. ' of item ' .. item end
  return ' of item ' .. item
end

local function bad(what, p, want)
  return what .. ' (ARGV[' .. p .. ']) ' .. show(ARGV[p]) .. ': ' .. want
end

local function check()
  local na, nk = #ARGV, #KEYS
  if na < 3 then return 'arguments: want at least 3 ARGV, got ' .. na end
  if not int(ARGV[1], 1, MAX_TTL) then return bad('ttl_ms', 1, 'want an integer 1..' .. MAX_TTL) end
  if #ARGV[2] < 1 or #ARGV[2] > 1024 then return 'group (ARGV[2]): want 1..1024 bytes' end
  local most = math.floor((na - 3) / 10)
  local n = int(ARGV[3], 0, most)
  if not n then
    return bad('number of items', 3, 'want an integer 0..' .. most .. ' (10 ARGV per item at least)')
  end
  -- The type each key index is used as, and its first use (for the error message).
  local need, u_label, u_item, u_cmd = {}, {}, {}, {}
  local function use(i, kind, label, item, c)
    local had = need[i]
    if not had then
      need[i], u_label[i], u_item[i], u_cmd[i] = kind, label, item, c
    elseif had ~= kind then
      return label .. where(item, c) .. ': KEYS[' .. i .. '] is used as a ' .. had .. ' by '
        .. u_label[i] .. where(u_item[i], u_cmd[i]) .. ', here as a ' .. kind
    end
    return nil
  end
  local p, e = 4, nil
  for item = 1, n do
    if p + 9 > na then
      return 'arguments: item ' .. item .. ' starts at ARGV[' .. p .. '], needs 10 ARGV, ' .. na .. ' in all'
    end
    local ki = int(ARGV[p], 0, nk)
    if not ki then return bad('idem key index' .. where(item), p, 'want a key index 0..' .. nk) end
    if ki > 0 then
      if not int(ARGV[p + 1], 1, MAX_INT) then
        return bad('fence' .. where(item), p + 1, 'want an integer 1..2^53')
      end
      if not STATUSES[ARGV[p + 2]] then
        return bad('status' .. where(item), p + 2, 'want succeeded, failed, retrying, expired or dead')
      end
      if not MODES[ARGV[p + 4]] then
        return bad('mode' .. where(item), p + 4, "want 'done' or 'release'")
      end
      e = use(ki, 'hash', 'idem key index', item)
      if e then return e end
    end
    local ri = int(ARGV[p + 6], 0, nk)
    if not ri then return bad('reply stream index' .. where(item), p + 6, 'want a key index 0..' .. nk) end
    if ri > 0 then
      e = use(ri, 'stream', 'reply stream index', item)
      if e then return e end
    end
    local ii = int(ARGV[p + 7], 0, nk)
    if not ii then return bad('inbox index' .. where(item), p + 7, 'want a key index 0..' .. nk) end
    if ii > 0 then
      if not stream_id_ok(ARGV[p + 8]) then
        return bad('entry id' .. where(item), p + 8, "want a stream id 'ms-seq'")
      end
      e = use(ii, 'stream', 'inbox index', item)
      if e then return e end
    end
    most = math.floor((na - p - 9) / 3)
    local ncmd = int(ARGV[p + 9], 0, most)
    if not ncmd then
      return bad('number of extra commands' .. where(item), p + 9,
        'want an integer 0..' .. most .. ' (3 ARGV per command at least)')
    end
    p = p + 10
    for c = 1, ncmd do
      if p + 2 > na then
        return 'arguments: extra command ' .. c .. where(item) .. ' starts at ARGV[' .. p
          .. '], needs 3 ARGV, ' .. na .. ' in all'
      end
      local spec = COMMANDS[ARGV[p]]
      if not spec then
        return bad('extra command ' .. c .. where(item), p, 'want XADD or ZADD')
      end
      local kidx = int(ARGV[p + 1], 1, nk)
      if not kidx then
        return bad('key index' .. where(item, c), p + 1, 'want a key index 1..' .. nk)
      end
      most = math.min(MAX_CMD_ARGS, na - p - 2)
      local nargs = int(ARGV[p + 2], 0, most)
      if not nargs then
        return bad('number of arguments' .. where(item, c), p + 2, 'want an integer 0..' .. most)
      end
      e = spec[2](p + 3, p + 2 + nargs)
      if e then return 'extra command ' .. c .. where(item) .. ' (ARGV[' .. p .. ']): ' .. e end
      e = use(kidx, spec[1], 'key index', item, c)
      if e then return e end
      p = p + 3 + nargs
    end
  end
  if p ~= na + 1 then
    return 'arguments: the ' .. n .. ' items end at ARGV[' .. (p - 1) .. '], got ' .. na .. ' ARGV'
  end
  for i = 1, nk do
    if need[i] then
      local kind = redis.call('TYPE', KEYS[i])['ok']
      if kind ~= need[i] and kind ~= 'none' then
        return 'KEYS[' .. i .. ']: holds a ' .. kind .. ', ' .. u_label[i] .. where(u_item[i], u_cmd[i])
          .. ' wants a ' .. need[i]
      end
    end
  end
  return nil
end

local err = check()
if err then return redis.error_reply('ERR reach: bad ' .. err) end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl, group = ARGV[1], ARGV[2]
local p = 4
local out = {}
for item = 1, tonumber(ARGV[3]) do
  local ki = tonumber(ARGV[p])
  local fence, status, reply, mode, err = ARGV[p + 1], ARGV[p + 2], ARGV[p + 3], ARGV[p + 4], ARGV[p + 5]
  local ri, ii, entry, ncmd = tonumber(ARGV[p + 6]), tonumber(ARGV[p + 7]), ARGV[p + 8], tonumber(ARGV[p + 9])
  p = p + 10
  local ok = true
  if ki > 0 then
    local key = KEYS[ki]
    local s = redis.call('HMGET', key, 'fence', 'done')
    if not s[1] or s[1] ~= fence or s[2] == '1' then
      ok = false
    else
      redis.call('HSET', key, 'status', status, 'updated_ms', now, 'error', err,
        'owner', '', 'lease_until', 0)
      if mode == 'done' then
        redis.call('HSET', key, 'done', '1', 'reply', reply)
      end
      redis.call('PEXPIRE', key, ttl)
    end
  end
  if ok and ri > 0 then
    redis.call('XADD', KEYS[ri], '*', 'r', reply)
    redis.call('PEXPIRE', KEYS[ri], ttl)
  end
  for _ = 1, ncmd do
    local name, kidx, nargs = ARGV[p], tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])
    if ok then
      redis.call(name, KEYS[kidx], unpack(ARGV, p + 3, p + 2 + nargs))
    end
    p = p + 3 + nargs
  end
  if ok and ii > 0 then
    redis.call('XACK', KEYS[ii], group, entry)
    redis.call('XDEL', KEYS[ii], entry)
  end
  out[item] = ok and 1 or 0
end
return out
