-- register.lua: add an agent's registration, or replace an older one (version fence).
--
-- KEYS[1] agents zset (agent_id -> next lease deadline, epoch ms)
-- KEYS[2] the agent's hash
-- KEYS[3] caps zset (capability -> number of agents declaring it)
-- KEYS[4] registry events stream
-- KEYS[5] capability-set key prefix (capability names are appended; same slot)
-- ARGV[1] agent_id
-- ARGV[2] instance_id (new every process start)
-- ARGV[3] version: start stamp in microseconds; an older one than stored is refused
-- ARGV[4] weight
-- ARGV[5] capabilities, normalised, comma-joined
-- ARGV[6] metadata, JSON object
-- ARGV[7] lease_ms
-- ARGV[8] evict_after_ms
-- ARGV[9] events stream max length (approximate)
-- ARGV[10] A2A agent card JSON, or ''
-- ARGV[11] ready flag, '0' or '1'
-- ARGV[12] max queue depth the agent accepts (0 = unbounded)
--
-- Returns {1, now_ms}: registered anew
--         {2, now_ms}: replaced a registration of the same agent_id (same or older version)
--         {-1, stored_version}: refused, a newer registration exists (stale)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]
local version = tonumber(ARGV[3])

local stored = redis.call('HMGET', KEYS[2], 'version', 'caps', 'state')
local code = 1
if stored[1] then
  if tonumber(stored[1]) > version then
    return {-1, stored[1]}
  end
  code = 2
  if stored[2] and stored[2] ~= '' then
    for cap in string.gmatch(stored[2], '[^,]+') do
      local set = KEYS[5] .. cap
      redis.call('SREM', set, id)
      local n = redis.call('SCARD', set)
      if n == 0 then redis.call('ZREM', KEYS[3], cap) else redis.call('ZADD', KEYS[3], n, cap) end
    end
  end
  redis.call('DEL', KEYS[2])
end

for cap in string.gmatch(ARGV[5], '[^,]+') do
  local set = KEYS[5] .. cap
  redis.call('SADD', set, id)
  redis.call('ZADD', KEYS[3], redis.call('SCARD', set), cap)
end

redis.call('HSET', KEYS[2],
  'agent_id', id, 'instance_id', ARGV[2], 'version', ARGV[3], 'weight', ARGV[4],
  'caps', ARGV[5], 'metadata', ARGV[6], 'lease_ms', ARGV[7], 'evict_after_ms', ARGV[8],
  'card', ARGV[10], 'ready', ARGV[11], 'draining', '0', 'state', 'active',
  'registered_ms', now, 'last_heartbeat_ms', now, 'state_ms', now,
  'ready_ms', (ARGV[11] == '1') and now or 0, 'queue_depth', 0, 'inflight', 0,
  'max_queue', ARGV[12])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[7]), id)
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[9], '*',
  'type', 'registered', 'agent_id', id, 'instance_id', ARGV[2], 'ts', now)
return {code, now}
