-- heartbeat.lua: renew an agent's lease and report its load.
--
-- KEYS[1] agents zset (agent_id -> next lease deadline, epoch ms)
-- KEYS[2] the agent's hash
-- KEYS[3] registry events stream
-- ARGV[1] agent_id: 1..256 bytes, no '{' or '}'
-- ARGV[2] instance_id: 1..256 bytes
-- ARGV[3] version (start stamp, microseconds): integer 0..2^53-1
-- ARGV[4] queue depth the agent reports (unread + pending entries): integer 0..2^53-1
-- ARGV[5] handlers in flight: integer 0..2^53-1
-- ARGV[6] events stream max length (approximate): integer 1..10000000
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
--!include registry
--!include now
--!include codes
local MAX = 9007199254740991

local function check()
  local e = arity(3, 6) or agent_id_bad(ARGV[1])
  if e then return e end
  if #ARGV[2] < 1 or #ARGV[2] > 256 then return 'instance_id: want 1..256 bytes' end
  if not int(ARGV[3], 0, MAX) then return 'version ' .. show(ARGV[3]) .. ': want an integer 0..2^53-1' end
  if not int(ARGV[4], 0, MAX) then return 'queue_depth ' .. show(ARGV[4]) .. ': want an integer 0..2^53-1' end
  if not int(ARGV[5], 0, MAX) then return 'inflight ' .. show(ARGV[5]) .. ': want an integer 0..2^53-1' end
  return maxlen_bad(ARGV[6]) or keys_typed({[1] = 'zset', [2] = 'hash', [3] = 'stream'})
end

local err = check()
if err then return refuse(err) end

local s = redis.call('HMGET', KEYS[2], 'version', 'state', 'lease_ms', 'draining', 'instance_id',
  'agent_id')
if not s[1] then
  return {HeartbeatCode_NOT_REGISTERED, 0}
end
local version = tonumber(ARGV[3])
local stored = int(s[1], 0, MAX)
-- A record this script cannot read is not a registration: re-registering replaces it.
if not stored or s[6] ~= ARGV[1] then
  return {HeartbeatCode_NOT_REGISTERED, 0}
end
if stored > version then
  return {HeartbeatCode_STALE, 0}
end
if stored < version or s[2] == 'evicted' then
  return {HeartbeatCode_NOT_REGISTERED, 0}
end
if s[5] ~= ARGV[2] then
  -- Same start stamp, another instance: it registered after this one and replaced it.
  return {HeartbeatCode_STALE, 0}
end
local lease = int(s[3], 1, DAY)
if not lease or (s[2] ~= 'active' and s[2] ~= 'probation') then
  return {HeartbeatCode_NOT_REGISTERED, 0}
end
local now = now_ms()
redis.call('HSET', KEYS[2], 'last_heartbeat_ms', now, 'queue_depth', ARGV[4], 'inflight', ARGV[5])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
local draining = (s[4] == '1') and 1 or 0
if s[2] == 'probation' then
  redis.call('HSET', KEYS[2], 'state', 'active', 'state_ms', now)
  event(KEYS[3], ARGV[6], 'recovered', ARGV[1], ARGV[2], now)
  return {HeartbeatCode_RECOVERED, draining}
end
return {HeartbeatCode_RENEWED, draining}
