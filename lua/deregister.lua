-- deregister.lua: remove an agent's registration for good (clean shutdown).
--
-- The agent is listed, in the same step, in its shard's reroute set and, with the time it
-- left, in the left zset: a caller whose registry view has not read the deregistration
-- yet may still send it a message, and the sweeper moves whatever lands in its inbox to
-- live agents (or parks it) for a grace after this time (reach.sweeper.REROUTE_GRACE_MS).
--
-- Every key is of the agent's registry shard, one hash slot (docs/protocol.md, "Registry
-- shards").
--
-- KEYS[1] agents zset
-- KEYS[2] the agent's hash: must be KEYS[6] .. ARGV[1]
-- KEYS[3] caps zset (capability -> number of agents declaring it)
-- KEYS[4] registry events stream
-- KEYS[5] capability-set key prefix (capability names are appended; same slot)
-- KEYS[6] agent-hash key prefix
-- KEYS[7] reroute set (set): the agent is added when removed
-- KEYS[8] left zset (agent_id -> epoch ms it deregistered): the agent is added when removed
-- ARGV[1] agent_id: 1..256 bytes, no '{' or '}'
-- ARGV[2] instance_id, or '' to remove whatever instance is registered: 0..256 bytes
-- ARGV[3] events stream max length (approximate): integer 1..10000000
--
-- Every argument is checked before the first write: a refused call writes nothing.
-- Integers are plain decimal digits (no sign, leading zero, exponent, hex, inf or nan).
--
-- Returns 1: removed; 0: no such agent (a stray agents-zset entry is removed);
--         -1: kept: another instance owns the registration (or the stored record names
--             another agent_id: written behind the scripts' back; the sweeper evicts it)
--         (the codes: DeregisterCode of lua/includes/codes.lua)
-- Errors  'reach: bad <argument>: <why>' (an error reply; redis-py raises ResponseError)
--         when an argument, or the number of KEYS or ARGV, is out of contract, or one of
--         KEYS[1..4], KEYS[7] or KEYS[8] holds another type than the one above.
--!include registry
--!include caps
--!include now
--!include codes

local function check()
  local e = arity(8, 3) or agent_id_bad(ARGV[1])
  if e then return e end
  if KEYS[2] ~= KEYS[6] .. ARGV[1] then return 'agent_id: KEYS[2] is not the hash of ' .. show(ARGV[1]) end
  if #ARGV[2] > 256 then return 'instance_id: want 0..256 bytes' end
  return maxlen_bad(ARGV[3]) or keys_typed({[1] = 'zset', [2] = 'hash', [3] = 'zset', [4] = 'stream', [7] = 'set', [8] = 'zset'})
end

local err = check()
if err then return refuse(err) end

local s = redis.call('HMGET', KEYS[2], 'instance_id', 'caps', 'agent_id')
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return DeregisterCode_NOT_FOUND
end
if s[3] ~= ARGV[1] or (ARGV[2] ~= '' and s[1] ~= ARGV[2]) then
  return DeregisterCode_OTHER_INSTANCE
end
local id = ARGV[1]
leave_caps(s[2], id, KEYS[5], KEYS[3])
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[1], id)
local now = now_ms()
redis.call('SADD', KEYS[7], id)
redis.call('ZADD', KEYS[8], now, id)
event(KEYS[4], ARGV[3], 'deregistered', id, s[1], now)
return DeregisterCode_REMOVED
