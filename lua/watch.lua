-- watch.lua: mark a task record watched, so the scripts that change it announce each
-- change on its channel from now on (lua/includes/announce.lua). A watcher subscribes to
-- the channel first, then calls this, then reads the record: a change made before this
-- call is in what it reads, one made after is announced to it.
--
-- KEYS[1] the message's idempotency record (a hash, or absent)
-- No ARGV.
--
-- An existing record gets the field 'watched' = 1 (its TTL is kept; the field stays for
-- the record's life: a later watcher finds it set). An absent record is not created.
--
-- Every argument, and the type of KEYS[1], is checked before the first write: a refused
-- call writes nothing.
--
-- Returns 1: the record is watched; 0: there is no record (never sent, or expired).
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of KEYS or ARGV, or the key's type, is out of
--         contract.
--!include args
--!include record

local err = arity(1, 0) or read_record(1, 'status')
if err then return refuse(err) end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'watched', 1)
return 1
