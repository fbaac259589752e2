-- step.lua: journal the result of a durable step (ctx.step, reach/steps.py) in the idempotency
-- record of the message whose handler ran it, only while that run still holds the message's
-- claim. A later run of the same key (after a crash and a takeover, a retry, a redelivery)
-- reads the journal and returns the stored result instead of running the step again.
--
-- KEYS[1] the message's idempotency record (a hash, or absent)
-- ARGV[1] owner: "<agent_id>/<instance_id>" of the run's claim, 1..1024 bytes
-- ARGV[2] fence: the fence of the run's claim (ctx.fence), integer 1..2^53
-- ARGV[3] step name, 1..StepBound_NAME_BYTES (200) bytes
-- ARGV[4] the step's result, msgpack bytes, 1..StepBound_RESULT_BYTES (65536) bytes
-- Integers are plain decimal digits without sign or leading zero.
--
-- The result is stored in field 's:<name>' and field 'steps' counts the results stored (at
-- most StepBound_STEPS, 100). Both exist only once a step was journaled: a record of a
-- message that ran no step has neither. Written only when the record is held by ARGV[1]
-- with fence ARGV[2] and not done (a claim made at send is held by its owner with fence
-- 1): a run whose claim was taken over or cancelled (a higher fence) writes nothing. The
-- record's TTL is left as the claim set it. A completion with mode 'done' deletes the
-- journal (lua/includes/fence.lua): a done key is replayed, never run again.
--
-- Every argument, and the type of the key, is checked before the first write: a refused
-- call writes nothing.
--
-- Returns {code, value} (the codes: StepCode of lua/includes/codes.lua):
--   {1, n}      journaled: n results are journaled now
--   {2, bytes}  a result of that name was journaled already: kept (the first one stays),
--               and returned
--   {3, n}      the journal is full (n = StepBound_STEPS results): nothing written
--   {0, ''}     fenced: the record is not held by that owner with that fence, or is done,
--               or is gone: nothing written
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of KEYS or ARGV, an argument, or the key's type is
--         out of contract.
local MAX_FENCE = 9007199254740992

--!include args
--!include codes

local function check()
  local e = arity(1, 4) or bytes_bad('owner', 1, 1, 1024)
    or int_bad('fence', 2, 1, MAX_FENCE)
    or bytes_bad('name', 3, 1, StepBound_NAME_BYTES)
    or bytes_bad('result', 4, 1, StepBound_RESULT_BYTES)
  if e then return e end
  return nil
end

local err = check()
if err then return refuse(err) end
-- Read here instead of asked its TYPE: one command, and HMGET fails on exactly what is not a
-- hash.
local field = 's:' .. ARGV[3]
local rec = redis.pcall('HMGET', KEYS[1], 'owner', 'fence', 'done', 'steps', field)
if rec['err'] then
  return refuse('KEYS[1]: holds a ' .. redis.call('TYPE', KEYS[1])['ok'] .. ', want a hash')
end

if rec[1] ~= ARGV[1] or rec[2] ~= ARGV[2] or rec[3] == '1' then
  return {StepCode_FENCED, ''}
end
if rec[5] then return {StepCode_KEPT, rec[5]} end
local n = tonumber(rec[4])
if not n or n ~= n or n < 0 then n = 0 end  -- a counter someone else wrote over
if n >= StepBound_STEPS then return {StepCode_FULL, n} end
redis.call('HSET', KEYS[1], field, ARGV[4], 'steps', n + 1)
return {StepCode_JOURNALED, n + 1}
