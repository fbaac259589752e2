-- drain.lua: mark an agent as draining: routing stops sending it new work; the agent
-- finishes what it holds, then deregisters (it learns of the flag on its next heartbeat).
--
-- KEYS[1] the agent's hash
-- KEYS[2] registry events stream
-- ARGV[1] agent_id
-- ARGV[2] events stream max length (approximate)
--
-- Returns 1: now draining; 2: was already draining; 0: no such live agent
local s = redis.call('HMGET', KEYS[1], 'state', 'draining', 'instance_id')
if not s[1] or s[1] == 'evicted' then
  return 0
end
if s[2] == '1' then
  return 2
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'draining', '1', 'draining_ms', now)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*',
  'type', 'draining', 'agent_id', ARGV[1], 'instance_id', s[3], 'ts', now)
return 1
