-- mark_ready.lua: set an agent's readiness (routing skips agents that are not ready).
--
-- KEYS[1] the agent's hash
-- KEYS[2] registry events stream
-- ARGV[1] agent_id
-- ARGV[2] instance_id
-- ARGV[3] ready flag, '1' or '0'
-- ARGV[4] events stream max length (approximate)
--
-- Returns 1: set; 0: not registered (or evicted): register again; -1: another instance owns it
local s = redis.call('HMGET', KEYS[1], 'instance_id', 'state', 'ready')
if not s[1] or s[2] == 'evicted' then
  return 0
end
if s[1] ~= ARGV[2] then
  return -1
end
if s[3] == ARGV[3] then
  return 1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'ready', ARGV[3], 'ready_ms', (ARGV[3] == '1') and now or 0)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*',
  'type', (ARGV[3] == '1') and 'ready' or 'unready', 'agent_id', ARGV[1], 'instance_id', s[1], 'ts', now)
return 1
