-- mark_scheduled.lua: give a scheduled send its task record before it is kept in the
-- scheduled set (the record is in the slot of its own key, the set in the namespace's:
-- the client runs this, then schedule.lua). A caller's idempotency key also needs the
-- msg_id -> key pointer, in the msg_id's slot: the client writes it with a plain SET.
--
-- KEYS[1] the message's idempotency record (hash; also its task status)
-- ARGV[1] capability, 1..1024 bytes
-- ARGV[2] msg_id, 1..1024 bytes
-- ARGV[3] due time, epoch ms, integer 0..999999999999999
-- ARGV[4] ttl_ms of the record, integer 1..31536000000 (365 days)
-- Integers are plain decimal digits without sign or leading zero.
--
-- A record that does not exist is written: status 'scheduled', capability, attempt 0,
-- sent_msg_id, due_ms, updated_ms (server time), living ARGV[4]. An existing record (a
-- caller's key used before) keeps its fields and TTL: send.lua decides at delivery what
-- its status becomes, as for any resend of the key.
--
-- Returns 1: the record was written; 0: it existed (left as it is).
-- Errors  'ERR reach: bad <argument>: <why>' when an argument or a key's type is out of
--         contract; nothing is written then.
--!include args
--!include key_types
--!include now

local MAX_TTL = 31536000000

local function check()
  local e = arity(1, 4) or bytes_bad('capability', 1, 1, 1024) or bytes_bad('msg_id', 2, 1, 1024)
    or int_bad('due_ms', 3, 0, 999999999999999) or int_bad('ttl_ms', 4, 1, MAX_TTL)
  if e then return e end
  return keys_typed({'hash'})
end

local err = check()
if err then return refuse(err) end

if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'status', 'scheduled', 'capability', ARGV[1], 'attempt', 0,
  'sent_msg_id', ARGV[2], 'due_ms', ARGV[3], 'updated_ms', now_ms())
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
