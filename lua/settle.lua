-- settle.lua: complete a batch of handled messages in one atomic step (standalone Redis).
-- For each item: store the outcome in its idempotency record if the fence still matches
-- (as complete.lua), and only then run the item's follow-up commands: publish the reply,
-- file a dead letter or a delayed retry, XACK + XDEL the inbox entry. On a Cluster the
-- keys live in different slots, so the runtime uses complete.lua and a pipeline instead.
--
-- KEYS: every key the batch touches (idempotency records, reply streams, dead-letter
--       streams, the delayed zset, inbox streams); items refer to them by index
-- ARGV[1] ttl_ms of idempotency records
-- ARGV[2] number of items, then for each item:
--   idem key index (0 = nothing to complete: run the commands), fence, status,
--   reply bytes, mode ('done' | 'release'), error text, number of commands,
--   then each command: name, key index, number of arguments, arguments...
--   (names allowed: XADD, PEXPIRE, ZADD, XACK, XDEL)
--
-- Returns one code per item: 1 settled (its commands ran); 0 fenced: another owner
-- claimed the key since, nothing was written for this item
local allowed = {XADD = true, PEXPIRE = true, ZADD = true, XACK = true, XDEL = true}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = ARGV[1]
local p = 3
local out = {}
for item = 1, tonumber(ARGV[2]) do
  local ki = tonumber(ARGV[p])
  local fence, status, reply, mode, err = ARGV[p + 1], ARGV[p + 2], ARGV[p + 3], ARGV[p + 4], ARGV[p + 5]
  local ncmd = tonumber(ARGV[p + 6])
  p = p + 7
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
  for _ = 1, ncmd do
    local name, kidx, nargs = ARGV[p], tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])
    if ok then
      if not allowed[name] then
        return redis.error_reply('settle.lua: command not allowed: ' .. name)
      end
      redis.call(name, KEYS[kidx], unpack(ARGV, p + 3, p + 2 + nargs))
    end
    p = p + 3 + nargs
  end
  out[item] = ok and 1 or 0
end
return out
