-- heartbeat.lua: renew an agent's lease and report its load.
--
-- KEYS[1] agents zset (agent_id -> next lease deadline, epoch ms)
-- KEYS[2] the agent's hash
-- KEYS[3] registry events stream
-- ARGV[1] agent_id
-- ARGV[2] instance_id
-- ARGV[3] version (start stamp, microseconds)
-- ARGV[4] queue depth the agent reports (unread + pending entries)
-- ARGV[5] handlers in flight
-- ARGV[6] events stream max length (approximate)
--
-- Returns {1, draining}: lease renewed
--         {2, draining}: lease renewed and the agent came back from probation ('recovered')
--         {0, 0}: not registered (unknown, evicted, or an older registration): register again
--         {-1, 0}: a newer registration of this agent_id exists: this process is stale
local s = redis.call('HMGET', KEYS[2], 'version', 'state', 'lease_ms', 'draining')
if not s[1] then
  return {0, 0}
end
local version = tonumber(ARGV[3])
local stored = tonumber(s[1])
if stored > version then
  return {-1, 0}
end
if stored < version or s[2] == 'evicted' then
  return {0, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[2], 'last_heartbeat_ms', now, 'queue_depth', ARGV[4], 'inflight', ARGV[5])
redis.call('ZADD', KEYS[1], now + tonumber(s[3]), ARGV[1])
local draining = tonumber(s[4]) or 0
if s[2] == 'probation' then
  redis.call('HSET', KEYS[2], 'state', 'active', 'state_ms', now)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*',
    'type', 'recovered', 'agent_id', ARGV[1], 'instance_id', ARGV[2], 'ts', now)
  return {2, draining}
end
return {1, draining}
