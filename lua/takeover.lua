-- takeover.lua: end the claim of an idempotency key whose owner a runtime found gone
-- (dead, restarted, evicted), only if that owner still holds it. Another runtime may have
-- taken the key over between the runtime's read of the owner and this call; its fresh
-- claim must stand, else both would run the handler (a read-then-HSET from the client
-- is that race). After a 1 the runtime claims the key again with claim.lua.
--
-- KEYS[1] idempotency record (hash)
-- ARGV[1] the owner judged gone: "<agent_id>/<instance_id>" as read from the record
--
-- Returns 1: that owner's claim was ended (lease_until = 0); 0: the owner changed (or
-- the record is gone): the key is someone else's now, do not take it over
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'lease_until', 0)
  return 1
end
return 0
