-- settle.lua: complete a batch of handled messages in one atomic step (standalone Redis).
-- For each item: store the outcome in its idempotency record if the fence still matches
-- (as complete.lua), and only then run the item's follow-up commands: publish the reply,
-- file a dead letter or a delayed retry, XACK + XDEL the inbox entry. On a Cluster the
-- keys live in different slots, so the runtime uses complete.lua and a pipeline instead.
--
-- KEYS: every key the batch touches (idempotency records, reply streams, dead-letter
--       streams, the delayed zset, inbox streams); items refer to them by index
-- ARGV[1] ttl_ms of idempotency records and reply streams
-- ARGV[2] the inbox consumer group
-- ARGV[3] number of items, then for each item:
--   idem key index (0 = nothing to complete), fence, status, reply bytes,
--   mode ('done': store the reply, later deliveries replay it | 'release': the key may run
--   again), error text, reply stream index (0 = publish no reply), inbox stream index
--   (0 = no ack), entry id, number of extra commands, then each extra command:
--   name, key index, number of arguments, arguments... (names allowed: XADD, ZADD)
--
-- Errors: 'command not allowed: NAME' for any other name, before anything is written
--
-- Returns one code per item: 1 settled (reply published, extra commands run, entry
-- acked and deleted); 0 fenced: another owner claimed the key since, nothing was written
-- for this item
local allowed = {XADD = true, ZADD = true}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl, group = ARGV[1], ARGV[2]
-- Check every follow-up command before writing anything: an error after a write would
-- leave the batch half done (Redis does not roll a script back).
local p = 4
for _ = 1, tonumber(ARGV[3]) do
  local ncmd = tonumber(ARGV[p + 9])
  p = p + 10
  for _ = 1, ncmd do
    if not allowed[ARGV[p]] then
      return redis.error_reply('settle.lua: command not allowed: ' .. ARGV[p])
    end
    p = p + 3 + tonumber(ARGV[p + 2])
  end
end
p = 4
local out = {}
for item = 1, tonumber(ARGV[3]) do
  local ki = tonumber(ARGV[p])
  local fence, status, reply, mode, err = ARGV[p + 1], ARGV[p + 2], ARGV[p + 3], ARGV[p + 4], ARGV[p + 5]
  local ri, ii, entry, ncmd = tonumber(ARGV[p + 6]), tonumber(ARGV[p + 7]), ARGV[p + 8], tonumber(ARGV[p + 9])
  p = p + 10
  local ok = true
  if ki > 0 then
    local key = KEYS[ki]
    local s = redis.call('HMGET', key, 'fence', 'done')
    if not s[1] or s[1] ~= fence or s[2] == '1' then
      ok = false
    else
      redis.call('HSET', key, 'status', status, 'updated_ms', now, 'error', err,
        'owner', '', 'lease_until', 0)
      if mode == 'done' then
        redis.call('HSET', key, 'done', '1', 'reply', reply)
      end
      redis.call('PEXPIRE', key, ttl)
    end
  end
  if ok and ri > 0 then
    redis.call('XADD', KEYS[ri], '*', 'r', reply)
    redis.call('PEXPIRE', KEYS[ri], ttl)
  end
  for _ = 1, ncmd do
    local name, kidx, nargs = ARGV[p], tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])
    if ok then
      redis.call(name, KEYS[kidx], unpack(ARGV, p + 3, p + 2 + nargs))
    end
    p = p + 3 + nargs
  end
  if ok and ii > 0 then
    redis.call('XACK', KEYS[ii], group, entry)
    redis.call('XDEL', KEYS[ii], entry)
  end
  out[item] = ok and 1 or 0
end
return out
