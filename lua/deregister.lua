-- deregister.lua: remove an agent's registration for good (clean shutdown).
--
-- KEYS[1] agents zset
-- KEYS[2] the agent's hash
-- KEYS[3] caps zset (capability -> number of agents declaring it)
-- KEYS[4] registry events stream
-- KEYS[5] capability-set key prefix (capability names are appended; same slot)
-- ARGV[1] agent_id
-- ARGV[2] instance_id, or '' to remove whatever instance is registered
-- ARGV[3] events stream max length (approximate)
--
-- Returns 1: removed; 0: no such agent; -1: another instance owns the registration (kept)
local s = redis.call('HMGET', KEYS[2], 'instance_id', 'caps')
if not s[1] then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
if ARGV[2] ~= '' and s[1] ~= ARGV[2] then
  return -1
end
local id = ARGV[1]
for cap in string.gmatch(s[2] or '', '[^,]+') do
  local set = KEYS[5] .. cap
  redis.call('SREM', set, id)
  local n = redis.call('SCARD', set)
  if n == 0 then redis.call('ZREM', KEYS[3], cap) else redis.call('ZADD', KEYS[3], n, cap) end
end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[1], id)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*',
  'type', 'deregistered', 'agent_id', id, 'instance_id', s[1], 'ts', now)
return 1
