-- drain.lua: mark an agent as draining: routing stops sending it new work; the agent
-- finishes what it holds, then deregisters (it learns of the flag on its next heartbeat).
--
-- Both keys are of the agent's registry shard, one hash slot (docs/protocol.md).
--
-- KEYS[1] the agent's hash
-- KEYS[2] registry events stream
-- ARGV[1] agent_id: 1..256 bytes, no '{' or '}'
-- ARGV[2] events stream max length (approximate): integer 1..10000000
-- ARGV[3] (optional) instance_id: drain only this instance's registration; '' or absent =
--         whatever instance is registered (an operator's drain). 0..256 bytes
--
-- Every argument is checked before the first write: a refused call writes nothing.
-- Integers are plain decimal digits (no sign, leading zero, exponent, hex, inf or nan).
--
-- Returns 1: now draining; 2: was already draining;
--         0: no such live agent (none, evicted, or a stored record of another agent_id);
--         -1: another instance owns the registration (ARGV[3] given): nothing changed, so
--             a stale process stopping never drains the newer one that replaced it
--         (the codes: DrainCode of lua/includes/codes.lua)
-- Errors  'reach: bad <argument>: <why>' (an error reply; redis-py raises ResponseError)
--         when an argument, or the number of KEYS or ARGV, is out of contract, or a key
--         holds another type than the one above.
--!include registry
--!include now
--!include codes

local function check()
  if #KEYS ~= 2 or #ARGV < 2 or #ARGV > 3 then
    return 'arguments: want 2 KEYS and 2 or 3 ARGV, got ' .. #KEYS .. ' and ' .. #ARGV
  end
  local e = agent_id_bad(ARGV[1]) or maxlen_bad(ARGV[2])
  if e then return e end
  if ARGV[3] and #ARGV[3] > 256 then return 'instance_id: want 0..256 bytes' end
  return keys_typed({[1] = 'hash', [2] = 'stream'})
end

local err = check()
if err then return refuse(err) end

local s = registration(KEYS[1], ARGV[1], 'draining', 'instance_id')
if not s or not s[2] then return DrainCode_NOT_FOUND end
local instance = ARGV[3] or ''
if instance ~= '' and s[4] ~= instance then return DrainCode_OTHER_INSTANCE end
if s[3] == '1' then return DrainCode_ALREADY_DRAINING end
local now = now_ms()
redis.call('HSET', KEYS[1], 'draining', '1', 'draining_ms', now)
event(KEYS[2], ARGV[2], 'draining', ARGV[1], s[4], now)
return DrainCode_DRAINING
