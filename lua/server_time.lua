-- server_time.lua: the Redis server's clock, as TIME answers it, read on the node that
-- holds KEYS[1]'s hash slot. Writes nothing, reads no key.
--
-- A process measures its clock's offset to Redis's with it (reach.clock; deadlines are
-- judged on Redis's clock). On a Redis Cluster a keyless TIME would go to some master over
-- a connection of its own, and the masters' clocks may differ; a key routes the call like
-- every other command of the process, on the connection it already holds to that key's
-- node. The Python runtime passes shard 0's agents zset (reach:{ns}:agents), so every
-- process of a namespace reads the clock of the same master, the one holding the registry.
--
-- KEYS[1] any key of the slot whose master's clock to read (only routes the call: not read)
-- (no ARGV)
--
-- Returns {seconds, microseconds}: TIME's reply as it is (two bulk strings of decimal
--         digits: epoch seconds, and microseconds within that second)
-- Errors  'reach: bad arguments: want 1 KEYS and 0 ARGV, got <k> and <a>' (an error reply;
--         redis-py raises ResponseError) for any other number of KEYS or ARGV.
--!include args

local err = arity(1, 0)
if err then return refuse(err) end
return redis.call('TIME')
