-- deregister.lua: remove an agent's registration for good (clean shutdown).
--
-- KEYS[1] agents zset
-- KEYS[2] the agent's hash: must be KEYS[6] .. ARGV[1]
-- KEYS[3] caps zset (capability -> number of agents declaring it)
-- KEYS[4] registry events stream
-- KEYS[5] capability-set key prefix (capability names are appended; same slot)
-- KEYS[6] agent-hash key prefix
-- ARGV[1] agent_id: 1..256 bytes, no '{' or '}'
-- ARGV[2] instance_id, or '' to remove whatever instance is registered: 0..256 bytes
-- ARGV[3] events stream max length (approximate): integer 1..10000000
--
-- Every argument is checked before the first write: a refused call writes nothing.
-- Integers are plain decimal digits (no sign, leading zero, exponent, hex, inf or nan).
--
-- Returns 1: removed; 0: no such agent (a stray agents-zset entry is removed);
--         -1: kept: another instance owns the registration (or the stored record names
--             another agent_id: written behind the scripts' back; the sweeper evicts it)
-- Errors  'reach: bad <argument>: <why>' (an error reply; redis-py raises ResponseError)
--         when an argument, or the number of KEYS or ARGV, is out of contract, or one of
--         KEYS[1..4] holds another type than the one above.
local function show(v)
  return (string.gsub(string.sub(tostring(v), 1, 40), '[^%w%.%+%-_ ]', '?'))
end

-- A key of another type (written behind the scripts' back) would fail a command half-way
-- through the writes: refuse before the first one.
local function key_type(key, want)
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= want then return 'holds a ' .. t .. ', want a ' .. want end
  return nil
end

local function keys_typed(wanted)
  for i, want in pairs(wanted) do
    local bad = key_type(KEYS[i], want)
    if bad then return 'KEYS[' .. i .. ']: ' .. bad end
  end
  return nil
end

local function check()
  if #KEYS ~= 6 or #ARGV ~= 3 then
    return 'arguments: want 6 KEYS and 3 ARGV, got ' .. #KEYS .. ' and ' .. #ARGV
  end
  if #ARGV[1] < 1 or #ARGV[1] > 256 or string.find(ARGV[1], '[{}]') then
    return 'agent_id: want 1..256 bytes, no braces'
  end
  if KEYS[2] ~= KEYS[6] .. ARGV[1] then return 'agent_id: KEYS[2] is not the hash of ' .. show(ARGV[1]) end
  if #ARGV[2] > 256 then return 'instance_id: want 0..256 bytes' end
  local m = ARGV[3]
  if #m > 8 or not string.find(m, '^[1-9]%d*$') or tonumber(m) < 1 or tonumber(m) > 10000000 then
    return 'events maxlen ' .. show(m) .. ': want an integer 1..10000000'
  end
  return keys_typed({[1] = 'zset', [2] = 'hash', [3] = 'zset', [4] = 'stream'})
end

local err = check()
if err then return redis.error_reply('ERR reach: bad ' .. err) end

local s = redis.call('HMGET', KEYS[2], 'instance_id', 'caps', 'agent_id')
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
if s[3] ~= ARGV[1] or (ARGV[2] ~= '' and s[1] ~= ARGV[2]) then
  return -1
end
local id = ARGV[1]
for cap in string.gmatch(s[2] or '', '[^,]+') do
  local set = KEYS[5] .. cap
  if not key_type(set, 'set') then  -- a key of another type cannot hold this agent
    redis.call('SREM', set, id)
    local n = redis.call('SCARD', set)
    if n == 0 then redis.call('ZREM', KEYS[3], cap) else redis.call('ZADD', KEYS[3], n, cap) end
  end
end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[1], id)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*',
  'type', 'deregistered', 'agent_id', id, 'instance_id', s[1] or '', 'ts', now)
return 1
