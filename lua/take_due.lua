-- take_due.lua: take the scheduled sends that are due, for one mover: each taken entry's
-- due time is pushed forward by a lease, so no other mover takes it while this one places
-- it; the mover removes it (unschedule.lua) once placed. A mover that dies leaves it to
-- be taken again when its lease is over (placed twice at worst: idempotency runs it once).
--
-- KEYS[1] the scheduled set (zset: msg_id -> due, epoch ms)
-- KEYS[2] the scheduled envelopes (hash: msg_id -> envelope bytes)
-- ARGV[1] limit: how many to take at most, integer 1..10000
-- ARGV[2] lease_ms, integer 1..86400000
-- Integers are plain decimal digits without sign or leading zero.
--
-- Due means a due time at or before the server's time. A due msg_id without an envelope
-- (written behind the scripts' back) is removed from the set and not returned.
--
-- Returns {now, next, msg_id_1, envelope_1, ..., msg_id_n, envelope_n}: the server time
-- (epoch ms), the earliest due time left in the set after the take (taken entries
-- included, at their lease end) or -1 when the set is empty, and the entries taken.
-- Errors  'ERR reach: bad <argument>: <why>' when an argument or a key's type is out of
--         contract; nothing is written then.
--!include args
--!include key_types
--!include now

local function check()
  local e = arity(2, 2) or int_bad('limit', 1, 1, 10000) or int_bad('lease_ms', 2, 1, 86400000)
  if e then return e end
  return keys_typed({'zset', 'hash'})
end

local err = check()
if err then return refuse(err) end

local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {now, -1}
local until_ms = now + tonumber(ARGV[2])
for _, id in ipairs(due) do
  local env = redis.call('HGET', KEYS[2], id)
  if env then
    redis.call('ZADD', KEYS[1], 'XX', until_ms, id)
    out[#out + 1] = id
    out[#out + 1] = env
  else
    redis.call('ZREM', KEYS[1], id)
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then out[2] = tonumber(first[2]) end
return out
