-- complete.lua: settle claimed idempotency keys, each only if the caller still holds its
-- claim (fence token). Standalone Redis gets a batch in one call; a Cluster one key a call.
--
-- KEYS[1..n] idempotency records (hashes)
-- ARGV[1] ttl_ms: how long a record lives from now
-- for KEYS[i], j = 1 + 5 * (i - 1):
--   ARGV[j+1] fence token returned by claim.lua
--   ARGV[j+2] task status: succeeded | failed | retrying | expired | dead
--   ARGV[j+3] reply bytes (the stored outcome), or ''
--   ARGV[j+4] mode: 'done' (final: later deliveries replay the stored reply) or
--             'release' (the key may be claimed and run again: retry, dead-letter replay)
--   ARGV[j+5] error text for the status ('' = none)
--
-- Returns one code per key, in order:
--   1: settled
--   0: fenced: another owner claimed the key since (this worker's claim ran out); nothing
--      was written and the caller must not reply or ack
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i, key in ipairs(KEYS) do
  local j = 1 + 5 * (i - 1)
  local s = redis.call('HMGET', key, 'fence', 'done')
  if not s[1] or s[1] ~= ARGV[j + 1] or s[2] == '1' then
    out[i] = 0
  else
    redis.call('HSET', key, 'status', ARGV[j + 2], 'updated_ms', now, 'error', ARGV[j + 5],
      'owner', '', 'lease_until', 0)
    if ARGV[j + 4] == 'done' then
      redis.call('HSET', key, 'done', '1', 'reply', ARGV[j + 3])
    end
    redis.call('PEXPIRE', key, ARGV[1])
    out[i] = 1
  end
end
return out
