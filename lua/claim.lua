-- claim.lua: take the idempotency key of a message before running its handler.
-- The record is a hash (one per key) that also carries the task status of the message.
--
-- KEYS[1] the idempotency record (hash)
-- ARGV[1] owner: the claiming runtime's instance id
-- ARGV[2] lease_ms: how long the claim holds without being completed
-- ARGV[3] ttl_ms: how long the record lives
-- ARGV[4] msg_id of the delivery that claims
-- ARGV[5] agent_id of the claiming agent
--
-- Returns {1, fence}: claimed; run the handler; complete with this fence token
--         {2, reply}: already done; reply with the stored bytes, do not run again
--         {3, owner}: another live owner holds the claim; do not run (leave it pending)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('HMGET', KEYS[1], 'done', 'reply', 'owner', 'lease_until')
if s[1] == '1' then
  return {2, s[2]}
end
if s[3] and s[3] ~= '' and s[3] ~= ARGV[1] and tonumber(s[4] or '0') > now then
  return {3, s[3]}
end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'lease_until', now + tonumber(ARGV[2]),
  'status', 'running', 'msg_id', ARGV[4], 'agent_id', ARGV[5], 'updated_ms', now)
redis.call('HINCRBY', KEYS[1], 'runs', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, fence}
