-- send.lua: add a message to an agent's inbox and mark it pending, in one step, unless
-- the agent's inbox is at its bound (standalone Redis; on a Cluster the client runs
-- enqueue.lua on the inbox's slot, then writes the pending record).
--
-- KEYS[1] the inbox stream of the chosen agent and priority
-- KEYS[2] the message's idempotency record (hash; also its task status)
-- KEYS[3] the msg_id -> idempotency key pointer (written only when ARGV[5] ~= '')
-- KEYS[4..6] the agent's three inbox streams (high, normal, low; KEYS[1] is one of them):
--            given when ARGV[7] > 0, left out otherwise
-- ARGV[1] envelope bytes (msgpack)
-- ARGV[2] capability
-- ARGV[3] attempt, integer 0..999999999999999
-- ARGV[4] msg_id
-- ARGV[5] caller-chosen idempotency key, or '' (the key is then the msg_id)
-- ARGV[6] ttl_ms of the record and the pointer, integer 1..31536000000 (365 days)
-- ARGV[7] max_queue: the agent's bound on queued + in-flight messages, integer
--         0..999999999999999; 0 (or absent) = unbounded
-- Integers are plain decimal digits without sign or leading zero.
--
-- The bound counts the entries of the three inbox streams (XLEN: the runtime deletes an
-- entry once it is settled, so this is queued + being handled), at the moment of the add:
-- concurrent senders can never push an inbox past it.
--
-- Returns the inbox entry id (a string), or, when the inbox holds max_queue entries or
-- more, that number of entries (an integer) and nothing is written.
-- Errors  'ERR reach: bad <argument>: <why>' when an argument or a key's type is out of
--         contract; nothing is written then.
local MAX_TTL, MAX_INT = 31536000000, 999999999999999

--!include args
--!include key_types

local function check()
  if #ARGV < 6 or #ARGV > 7 then return 'arguments: want 6 or 7 ARGV, got ' .. #ARGV end
  local e = int_bad('attempt', 3, 0, MAX_INT) or int_bad('ttl_ms', 6, 1, MAX_TTL)
    or (ARGV[7] and int_bad('max_queue', 7, 0, MAX_INT))
  if e then return e end
  local max = tonumber(ARGV[7] or '0')
  if max > 0 and #KEYS ~= 6 then
    return 'keys: want 6 KEYS (the three inboxes too) with a max_queue, got ' .. #KEYS
  elseif max == 0 and #KEYS ~= 3 and #KEYS ~= 6 then
    return 'keys: want 3 KEYS (or 6), got ' .. #KEYS
  end
  return keys_typed({'stream', 'hash', 'string'}), max
end

local err, max = check()
if err then return refuse(err) end

if max > 0 then
  local depth = 0
  for i = 4, 6 do
    local why = key_type(KEYS[i], 'stream')
    if why then return refuse('KEYS[' .. i .. ']: ' .. why) end
    depth = depth + redis.call('XLEN', KEYS[i])
  end
  if depth >= max then return depth end
end

local id = redis.call('XADD', KEYS[1], '*', 'e', ARGV[1])
redis.call('HSETNX', KEYS[2], 'status', 'pending')
redis.call('HSET', KEYS[2], 'capability', ARGV[2], 'attempt', ARGV[3], 'sent_msg_id', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
if ARGV[5] ~= '' then
  redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[6])
end
return id
