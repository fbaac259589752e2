-- schedule.lua: keep a sealed envelope until it is due, in the namespace's scheduled set.
--
-- KEYS[1] the scheduled set (zset: msg_id -> due, epoch ms)
-- KEYS[2] the scheduled envelopes (hash: msg_id -> envelope bytes)
-- ARGV[1] msg_id, 1..1024 bytes
-- ARGV[2] due time, epoch ms, integer 0..999999999999999
-- ARGV[3] envelope bytes (msgpack, sealed: signed by its sender when signing is on),
--         1..536870912 bytes
-- Integers are plain decimal digits without sign or leading zero.
--
-- A msg_id already in the set is left as it is (its due time and envelope unchanged): a
-- scheduled send is written once.
--
-- Returns 1: scheduled; 0: that msg_id was scheduled already (nothing written).
-- Errors  'ERR reach: bad <argument>: <why>' when an argument or a key's type is out of
--         contract; nothing is written then.
--!include args
--!include key_types

local function check()
  local e = arity(2, 3) or bytes_bad('msg_id', 1, 1, 1024)
    or int_bad('due_ms', 2, 0, 999999999999999) or bytes_bad('envelope', 3, 1, 536870912)
  if e then return e end
  return keys_typed({'zset', 'hash'})
end

local err = check()
if err then return refuse(err) end

if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
