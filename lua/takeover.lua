-- takeover.lua: end the claim of an idempotency key whose owner a runtime found gone
-- (dead, restarted, evicted), only if that owner still holds it. Another runtime may have
-- taken the key over between the runtime's read of the owner and this call; its fresh
-- claim must stand, else both would run the handler (a read-then-HSET from the client
-- is that race). After a 1 the runtime claims the key again with claim.lua.
--
-- KEYS[1] idempotency record (a hash, or absent)
-- ARGV[1] the owner judged gone: "<agent_id>/<instance_id>" as read from the record (any
--         bytes, '' included: the runtime passes what it read, or '' when there was none)
--
-- Returns 1: that owner's claim was ended (lease_until = 0); 0: the owner changed (or
-- the record is gone): the key is someone else's now, do not take it over
--         (the codes: TakeoverCode of lua/includes/codes.lua)
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of KEYS or ARGV, or the key's type, is out of
--         contract; nothing is written then.
--!include args
--!include record
--!include codes

local err = arity(1, 1) or read_record(1, 'owner')
if err then return refuse(err) end
if record(1, 'owner')[1] == ARGV[1] then
  redis.call('HSET', KEYS[1], 'lease_until', 0)
  return TakeoverCode_ENDED
end
return TakeoverCode_OWNER_CHANGED
