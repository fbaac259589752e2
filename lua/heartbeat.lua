-- heartbeat.lua: renew an agent's lease and report its load.
--
-- Every key is of the agent's registry shard, one hash slot (docs/protocol.md, "Registry
-- shards").
--
-- KEYS[1] agents zset (agent_id -> next lease deadline, epoch ms)
-- KEYS[2] the agent's hash
-- KEYS[3] registry events stream
-- ARGV[1] agent_id: 1..256 bytes, no '{' or '}'
-- ARGV[2] instance_id: 1..256 bytes
-- ARGV[3] version (start stamp, microseconds): integer 0..2^53-1
-- ARGV[4] queue depth the agent reports (unread + pending entries): integer 0..2^53-1
-- ARGV[5] handlers in flight: integer 0..2^53-1
-- ARGV[6] slots: the agent's concurrency (handlers it runs at once), integer 0..2^53-1
--         (0: not reported)
-- ARGV[7] handler_us: its handlers' recent mean run time, microseconds, integer
--         0..2^53-1 (0: not known yet)
-- ARGV[8] events stream max length (approximate): integer 1..10000000
-- ARGV[9] (optional) cap_us: its per-capability mean run times of a message of cost 1,
--         '<capability>=<µs>' items separated by one space (each capability 1..200 bytes
--         of [a-z0-9_.], each µs an integer 0..2^53-1), at most 65536 bytes; written to
--         the record's field cap_us, '' deletes it; absent: the field is left as it is
--
-- Every argument is checked before the first write: a refused call writes nothing.
-- Integers are plain decimal digits (no sign, leading zero, exponent, hex, inf or nan).
--
-- Returns {1, draining}: lease renewed
--         {2, draining}: lease renewed and the agent came back from probation ('recovered')
--         {0, 0}: not registered (unknown, evicted, an older registration, or a stored
--                 record this script cannot read, e.g. of another agent_id or with a
--                 lease that is not a number): register again, which replaces it
--         {-1, 0}: this process is stale: a newer registration of this agent_id exists
--                  (a higher version, or the same version under another instance_id)
--         (the codes: HeartbeatCode of lua/includes/codes.lua)
-- Errors  'reach: bad <argument>: <why>' (an error reply; redis-py raises ResponseError)
--         when an argument, or the number of KEYS or ARGV, is out of contract, or a key
--         holds another type than the one above.
--!include lease

local function check()
  if #ARGV == 9 then
    local e = cap_us_bad(ARGV[9])
    if e then return e end
  end
  return arity(3, #ARGV == 9 and 9 or 8) or beat_bad(1) or maxlen_bad(ARGV[8])
    or keys_typed({[1] = 'zset', [2] = 'hash', [3] = 'stream'})
end

local err = check()
if err then return refuse(err) end

local code, draining = beat(KEYS[1], KEYS[2], KEYS[3], ARGV[8], 1, now_ms(), ARGV[9])
return {code, draining}
