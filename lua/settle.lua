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
-- in lo..hi; nil for anything else.
local function int(v, lo, hi)
  if type(v) ~= 'string' or #v > 16 or not (v == '0' or string.find(v, '^[1-9]%d*$')) then
    return nil
  end
  local n = tonumber(v)
  if n < lo or n > hi then return nil end
  return n
end

local function u64(s)
  return #s >= 1 and (#s < 20 or (#s == 20 and s <= U64))
end

-- A stream entry id XACK and XDEL accept: 'ms-seq' or 'ms', each part 0..2^64-1.
local function stream_id_ok(v)
  local ms, seq = string.match(v, '^(%d+)%-(%d+)$')
  if not ms then
    ms, seq = string.match(v, '^(%d+)$'), '0'
  end
  return ms ~= nil and u64(ms) and u64(seq)
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

local function check()
  if #ARGV < 3 then return 'arguments: want at least 3 ARGV, got ' .. #ARGV end
  if not int(ARGV[1], 1, MAX_TTL) then
    return 'ttl_ms (ARGV[1]) ' .. show(ARGV[1]) .. ': want an integer 1..' .. MAX_TTL
  end
  if #ARGV[2] < 1 or #ARGV[2] > 1024 then return 'group (ARGV[2]): want 1..1024 bytes' end
  local n = int(ARGV[3], 0, math.floor((#ARGV - 3) / 10))
  if not n then
    return 'number of items (ARGV[3]) ' .. show(ARGV[3]) .. ': want an integer 0..'
      .. math.floor((#ARGV - 3) / 10) .. ' (10 ARGV per item at least)'
  end
  local nk = #KEYS
  local need, used_by = {}, {}
  -- Record that argument `what` uses key index i as a key of type kind.
  local function use(i, kind, what)
    if need[i] and need[i] ~= kind then
      return what .. ': KEYS[' .. i .. '] is used as a ' .. need[i] .. ' by ' .. used_by[i]
        .. ', here as a ' .. kind
    end
    need[i], used_by[i] = kind, what
    return nil
  end
  local function index(p, what, lo)
    local i = int(ARGV[p], lo, nk)
    if not i then
      return nil, what .. ' (ARGV[' .. p .. ']) ' .. show(ARGV[p]) .. ': want a key index '
        .. lo .. '..' .. nk
    end
    return i, nil
  end
  local p = 4
  for item = 1, n do
    local of = ' of item ' .. item
    if p + 9 > #ARGV then
      return 'arguments: item ' .. item .. ' starts at ARGV[' .. p .. '], needs 10 ARGV, ' .. #ARGV .. ' in all'
    end
    local ki, ri, ii, e
    ki, e = index(p, 'idem key index' .. of, 0)
    if e then return e end
    if ki > 0 then
      if not int(ARGV[p + 1], 1, MAX_INT) then
        return 'fence' .. of .. ' (ARGV[' .. (p + 1) .. ']) ' .. show(ARGV[p + 1]) .. ': want an integer 1..2^53'
      end
      if not STATUSES[ARGV[p + 2]] then
        return 'status' .. of .. ' (ARGV[' .. (p + 2) .. ']) ' .. show(ARGV[p + 2])
          .. ': want succeeded, failed, retrying, expired or dead'
      end
      if not MODES[ARGV[p + 4]] then
        return 'mode' .. of .. ' (ARGV[' .. (p + 4) .. ']) ' .. show(ARGV[p + 4]) .. ": want 'done' or 'release'"
      end
      e = use(ki, 'hash', 'idem key index' .. of)
      if e then return e end
    end
    ri, e = index(p + 6, 'reply stream index' .. of, 0)
    if e then return e end
    if ri > 0 then
      e = use(ri, 'stream', 'reply stream index' .. of)
      if e then return e end
    end
    ii, e = index(p + 7, 'inbox index' .. of, 0)
    if e then return e end
    if ii > 0 then
      if not stream_id_ok(ARGV[p + 8]) then
        return 'entry id' .. of .. ' (ARGV[' .. (p + 8) .. ']) ' .. show(ARGV[p + 8]) .. ": want a stream id 'ms-seq'"
      end
      e = use(ii, 'stream', 'inbox index' .. of)
      if e then return e end
    end
    local ncmd = int(ARGV[p + 9], 0, math.floor((#ARGV - p - 9) / 3))
    if not ncmd then
      return 'number of extra commands' .. of .. ' (ARGV[' .. (p + 9) .. ']) ' .. show(ARGV[p + 9])
        .. ': want an integer 0..' .. math.floor((#ARGV - p - 9) / 3) .. ' (3 ARGV per command at least)'
    end
    p = p + 10
    for c = 1, ncmd do
      local cmd = 'extra command ' .. c .. of
      if p + 2 > #ARGV then
        return 'arguments: ' .. cmd .. ' starts at ARGV[' .. p .. '], needs 3 ARGV, ' .. #ARGV .. ' in all'
      end
      local spec = COMMANDS[ARGV[p]]
      if not spec then
        return cmd .. ' (ARGV[' .. p .. ']) ' .. show(ARGV[p]) .. ': want XADD or ZADD'
      end
      local kidx
      kidx, e = index(p + 1, 'key index of ' .. cmd, 1)
      if e then return e end
      local nargs = int(ARGV[p + 2], 0, math.min(MAX_CMD_ARGS, #ARGV - p - 2))
      if not nargs then
        return 'number of arguments of ' .. cmd .. ' (ARGV[' .. (p + 2) .. ']) ' .. show(ARGV[p + 2])
          .. ': want an integer 0..' .. math.min(MAX_CMD_ARGS, #ARGV - p - 2)
      end
      e = spec[2](p + 3, p + 2 + nargs)
      if e then return cmd .. ' (ARGV[' .. p .. ']): ' .. e end
      e = use(kidx, spec[1], 'key index of ' .. cmd)
      if e then return e end
      p = p + 3 + nargs
    end
  end
  if p ~= #ARGV + 1 then
    return 'arguments: the ' .. n .. ' items end at ARGV[' .. (p - 1) .. '], got ' .. #ARGV .. ' ARGV'
  end
  for i = 1, nk do
    if need[i] then
      local kind = redis.call('TYPE', KEYS[i])['ok']
      if kind ~= need[i] and kind ~= 'none' then
        return 'KEYS[' .. i .. ']: holds a ' .. kind .. ', ' .. used_by[i] .. ' wants a ' .. need[i]
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
