-- mark_ready.lua: set an agent's readiness (routing skips agents that are not ready).
--
-- Both keys are of the agent's registry shard, one hash slot (docs/protocol.md).
--
-- KEYS[1] the agent's hash
-- KEYS[2] registry events stream
-- ARGV[1] agent_id: 1..256 bytes, no '{' or '}'
-- ARGV[2] instance_id: 1..256 bytes
-- ARGV[3] ready flag, '1' or '0'
-- ARGV[4] events stream max length (approximate): integer 1..10000000
--
-- Every argument is checked before the first write: a refused call writes nothing.
-- Integers are plain decimal digits (no sign, leading zero, exponent, hex, inf or nan).
--
-- Returns 1: set; 0: not registered (none, evicted, or a stored record of another
--         agent_id): register again; -1: another instance owns it (nothing changed)
--         (the codes: MarkReadyCode of lua/includes/codes.lua)
-- Errors  'reach: bad <argument>: <why>' (an error reply; redis-py raises ResponseError)
--         when an argument, or the number of KEYS or ARGV, is out of contract, or a key
--         holds another type than the one above.
--!include registry
--!include now
--!include codes

local function check()
  local e = arity(2, 4) or agent_id_bad(ARGV[1])
  if e then return e end
  if #ARGV[2] < 1 or #ARGV[2] > 256 then return 'instance_id: want 1..256 bytes' end
  if ARGV[3] ~= '0' and ARGV[3] ~= '1' then return 'ready ' .. show(ARGV[3]) .. ": want '0' or '1'" end
  return maxlen_bad(ARGV[4]) or keys_typed({[1] = 'hash', [2] = 'stream'})
end

local err = check()
if err then return refuse(err) end

local s = registration(KEYS[1], ARGV[1], 'instance_id', 'ready')
if not s or not s[3] then
  return MarkReadyCode_NOT_REGISTERED
end
if s[3] ~= ARGV[2] then
  return MarkReadyCode_OTHER_INSTANCE
end
if s[4] == ARGV[3] then
  return MarkReadyCode_SET
end
local now = now_ms()
redis.call('HSET', KEYS[1], 'ready', ARGV[3], 'ready_ms', (ARGV[3] == '1') and now or 0)
event(KEYS[2], ARGV[4], (ARGV[3] == '1') and 'ready' or 'unready', ARGV[1], s[3], now)
return MarkReadyCode_SET
