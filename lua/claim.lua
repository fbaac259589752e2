-- claim.lua: take the idempotency keys of delivered messages before running their handlers.
-- Each record is a hash (one per key) that also carries the task status of its message.
-- Standalone Redis gets a whole batch in one call; on a Cluster the runtime sends one key
-- per call (pipelined), since the records live in different slots.
--
-- KEYS[1..n] idempotency records (hashes)
-- ARGV[1] owner: "<agent_id>/<instance_id>" of the claiming runtime
-- ARGV[2] ttl_ms: how long a record lives
-- ARGV[3] agent_id of the claiming agent
-- ARGV[2+2i] lease_ms for KEYS[i]: how long the claim holds without being completed
-- ARGV[3+2i] msg_id of the delivery that claims KEYS[i]
--
-- Returns one reply per key, in order:
--   {1, fence}: claimed; run the handler, then complete with this fence token
--   {2, reply}: already done; reply with the stored bytes, do not run again
--   {3, owner}: an unexpired claim holds the key (another runtime's, or this runtime's own
--               for another copy of the message still running); do not run this copy now
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i, key in ipairs(KEYS) do
  local s = redis.call('HMGET', key, 'done', 'reply', 'owner', 'lease_until')
  if s[1] == '1' then
    out[i] = {2, s[2]}
  elseif s[3] and s[3] ~= '' and tonumber(s[4] or '0') > now then
    out[i] = {3, s[3]}
  else
    local fence = redis.call('HINCRBY', key, 'fence', 1)
    redis.call('HINCRBY', key, 'runs', 1)
    redis.call('HSET', key, 'owner', ARGV[1], 'lease_until', now + tonumber(ARGV[2 + 2 * i]),
      'status', 'running', 'msg_id', ARGV[3 + 2 * i], 'agent_id', ARGV[3], 'updated_ms', now)
    redis.call('PEXPIRE', key, ARGV[2])
    out[i] = {1, fence}
  end
end
return out
