-- complete.lua: settle a claimed idempotency key, only if the caller still holds the claim.
--
-- KEYS[1] the idempotency record (hash)
-- ARGV[1] fence token returned by claim.lua
-- ARGV[2] task status: succeeded | failed | retrying | expired | dead
-- ARGV[3] reply bytes (the stored outcome), or '' to keep none
-- ARGV[4] mode: 'done' (final: later deliveries replay the stored reply) or
--               'release' (the key may be claimed and run again: retry, dead letter replay)
-- ARGV[5] ttl_ms: how long the record lives from now
-- ARGV[6] error text for the status ('' = none)
--
-- Returns 1: settled
--         0: fenced: another owner claimed the key since (this worker's lease ran out);
--            nothing was written and the caller must not reply or ack
local s = redis.call('HMGET', KEYS[1], 'fence', 'done')
if not s[1] or s[1] ~= ARGV[1] or s[2] == '1' then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'updated_ms', now, 'error', ARGV[6],
  'owner', '', 'lease_until', 0)
if ARGV[4] == 'done' then
  redis.call('HSET', KEYS[1], 'done', '1', 'reply', ARGV[3])
end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
