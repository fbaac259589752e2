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
--         (the codes: SettleCode of lua/includes/codes.lua)
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError), e.g. 'reach: bad extra command 1 of item 2 (ARGV[14]) DEL: want
--         XADD or ZADD'. Only a bug or a hostile caller gets one: the runtime never sends
--         such a call.
--!include fence
--!include now
local MAX_TTL, MAX_INT, MAX_CMD_ARGS = 31536000000, 9007199254740992, 1000
local U64 = '18446744073709551615'

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
    if a > last or not int_memo(ARGV[a], 0, MAX_INT) then
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

local function check()
  local na, nk = #ARGV, #KEYS
  if na < 3 then return 'arguments: want at least 3 ARGV, got ' .. na end
  local e = int_bad('ttl_ms', 1, 1, MAX_TTL) or bytes_bad('group', 2, 1, 1024)
  if e then return e end
  local most = math.floor((na - 3) / 10)
  local n = int_memo(ARGV[3], 0, most)
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
  -- Why ARGV[p], a key index 0..#KEYS (0: none) used as a `kind`, is refused, or nil.
  -- more(p, item): what else to check, before the use, when it names a key.
  local function key_index(p, label, kind, item, more)
    local i = int_memo(ARGV[p], 0, nk)
    if not i then return bad(label .. where(item), p, 'want a key index 0..' .. nk) end
    if i == 0 then return nil end
    return (more and more(p, item)) or use(i, kind, label, item)
  end
  local function completion(p, item)
    return completion_bad(p + 1, where, item)
  end
  local function entry(p, item)
    if stream_id_ok(ARGV[p + 1]) then return nil end
    return bad('entry id' .. where(item), p + 1, "want a stream id 'ms-seq'")
  end
  local p = 4
  for item = 1, n do
    if p + 9 > na then
      return 'arguments: item ' .. item .. ' starts at ARGV[' .. p .. '], needs 10 ARGV, ' .. na .. ' in all'
    end
    e = key_index(p, 'idem key index', 'hash', item, completion)
      or key_index(p + 6, 'reply stream index', 'stream', item)
      or key_index(p + 7, 'inbox index', 'stream', item, entry)
    if e then return e end
    most = math.floor((na - p - 9) / 3)
    local ncmd = int_memo(ARGV[p + 9], 0, most)
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
      local kidx = int_memo(ARGV[p + 1], 1, nk)
      if not kidx then
        return bad('key index' .. where(item, c), p + 1, 'want a key index 1..' .. nk)
      end
      most = math.min(MAX_CMD_ARGS, na - p - 2)
      local nargs = int_memo(ARGV[p + 2], 0, most)
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
end

local err = check()
if err then return refuse(err) end

local now = now_ms()
local ttl, group = ARGV[1], ARGV[2]
local p = 4
local out = {}
for item = 1, tonumber(ARGV[3]) do
  local ki, ri, ii = tonumber(ARGV[p]), tonumber(ARGV[p + 6]), tonumber(ARGV[p + 7])
  local reply, entry, ncmd = ARGV[p + 3], ARGV[p + 8], tonumber(ARGV[p + 9])
  local code = SettleCode_SETTLED
  if ki > 0 then
    local key = KEYS[ki]
    code = complete_record(key, redis.call('HMGET', key, 'fence', 'done'), p + 1, ttl, now)
  end
  p = p + 10
  local ok = code == SettleCode_SETTLED
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
  out[item] = code
end
return out
