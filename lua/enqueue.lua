-- enqueue.lua: add a message to an agent's inbox unless the inbox is at its bound
-- (Redis Cluster: the inbox's part of send.lua; the client writes the pending record
-- afterwards, in the record's own slot).
--
-- KEYS[1] the inbox stream of the chosen agent and priority
-- KEYS[2..4] the agent's three inbox streams (high, normal, low; KEYS[1] is one of them)
-- ARGV[1] envelope bytes (msgpack)
-- ARGV[2] max_queue: the agent's bound on queued + in-flight messages, integer
--         1..999999999999999 (plain decimal digits without sign or leading zero)
--
-- The bound counts the entries of the three inbox streams (XLEN: the runtime deletes an
-- entry once it is settled, so this is queued + being handled), at the moment of the add.
--
-- Returns the inbox entry id (a string), or, when the inbox holds max_queue entries or
-- more, that number of entries (an integer) and nothing is written. An added entry is
-- announced on the shard channel named KEYS[2] (SPUBLISH, empty message): the wake-up of
-- an agent waiting on a Cluster.
-- Errors  'ERR reach: bad <argument>: <why>' when an argument or a key's type is out of
--         contract; nothing is written then.
local MAX_INT = 999999999999999

--!include args
--!include key_types

local v = ARGV[2]
local max = nil
if #KEYS == 4 and #ARGV == 2 and type(v) == 'string' and #v <= 16
    and string.find(v, '^[1-9]%d*$') then
  max = tonumber(v)
end
if not max or max > MAX_INT then
  return refuse('call: want 4 KEYS and 2 ARGV, max_queue (ARGV[2]) ' .. show(v) .. ' an integer 1..'
    .. MAX_INT)
end

local depth = 0
for i = 1, 4 do
  local why = key_type(KEYS[i], 'stream')
  if why then return refuse('KEYS[' .. i .. ']: ' .. why) end
  if i > 1 then depth = depth + redis.call('XLEN', KEYS[i]) end
end
if depth >= max then return depth end
local id = redis.call('XADD', KEYS[1], '*', 'e', ARGV[1])
-- Wake the agent if it waits (a runtime on a Cluster subscribes to this shard channel, named
-- as its first inbox stream, KEYS[2]); a server without sharded pub/sub (Redis < 7) leaves
-- the waiting agent to its next read, at most its block time later.
redis.pcall('SPUBLISH', KEYS[2], '')
return id
