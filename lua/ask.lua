-- ask.lua: a handler asks a question and waits for input (ctx.ask, reach/asking.py): put the
-- question in the message's idempotency record and set the task 'input_required', only
-- while the run that asks still holds the message's claim; or, when the ask has its answer
-- already (a re-run after a crash, a takeover, a retry), return the answer and change
-- nothing, so a question answered once is never put again.
--
-- KEYS[1] the message's idempotency record (a hash, or absent)
-- ARGV[1] owner: "<agent_id>/<instance_id>" of the run's claim, 1..1024 bytes
-- ARGV[2] fence: the fence of the run's claim (ctx.fence), integer 1..2^53
-- ARGV[3] n: the ask's number within the handler (its first ask is 1), integer 1..2^53
-- ARGV[4] question: UTF-8 text, 1..AskBound_QUESTION_BYTES (4096) bytes
-- ARGV[5] until_ms: when the ask gives up (epoch ms), integer 0..2^53 (0: never)
-- Integers are plain decimal digits without sign or leading zero.
--
-- An answer is kept in field 'a:<n>' (answer.lua). Asking writes status 'input_required',
-- 'question' (ARGV[4]), 'asking' (n: the ask waiting), 'ask_until_ms' (deleted when
-- ARGV[5] is 0) and updated_ms; 'asked', the highest n ever put, becomes n when n is
-- higher (a re-run putting the same ask again, unanswered, is not a new question); a
-- record claimed at send whose run is not counted yet (no runs, or runs 0) counts it
-- (runs 1). The
-- record's TTL is left as the claim set it; the claim's lease is the runtime's to renew
-- (renew.lua) while the handler waits. A watched record announces 'input_required'
-- (lua/includes/announce.lua).
--
-- Every argument, and the type of the key, is checked before the first write: a refused
-- call writes nothing.
--
-- Returns {code, value} (the codes: AskCode of lua/includes/codes.lua):
--   {1, new}    asked: the task waits for input; new = 1 when no run put ask n before,
--               else 0
--   {2, bytes}  ask n has its answer (the bytes answer.lua stored): nothing written
--   {4, max}    n is over AskBound_ASKS (100) questions: nothing written
--   {0, ''}     fenced: the record is not held by that owner with that fence, or is done,
--               or is gone: nothing written
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of KEYS or ARGV, an argument, or the key's type is
--         out of contract.
local MAX_INT = 9007199254740992

--!include args
--!include codes
--!include now
--!include announce

local function check()
  return arity(1, 5) or bytes_bad('owner', 1, 1, 1024)
    or int_bad('fence', 2, 1, MAX_INT)
    or int_bad('n', 3, 1, MAX_INT)
    or bytes_bad('question', 4, 1, AskBound_QUESTION_BYTES)
    or int_bad('until_ms', 5, 0, MAX_INT)
end

local err = check()
if err then return refuse(err) end
-- Read here instead of asked its TYPE: one command, and HMGET fails on exactly what is not a
-- hash.
local rec = redis.pcall('HMGET', KEYS[1], 'owner', 'fence', 'done', 'asked', 'watched',
  'a:' .. ARGV[3], 'runs')
if rec['err'] then
  return refuse('KEYS[1]: holds a ' .. redis.call('TYPE', KEYS[1])['ok'] .. ', want a hash')
end

if rec[1] ~= ARGV[1] or rec[2] ~= ARGV[2] or rec[3] == '1' then return {AskCode_FENCED, ''} end
if rec[6] then return {AskCode_ANSWERED, rec[6]} end
local n = tonumber(ARGV[3])
if n > AskBound_ASKS then return {AskCode_FULL, AskBound_ASKS} end
local asked = tonumber(rec[4])
if not asked or asked ~= asked then asked = 0 end  -- a counter someone else wrote over
local w = {'HSET', KEYS[1], 'status', 'input_required', 'question', ARGV[4], 'asking', ARGV[3],
  'updated_ms', now_ms()}
local new = n > asked
if new then w[#w + 1], w[#w + 2] = 'asked', ARGV[3] end
-- A run claimed at send (send.lua) is counted by start.lua or its completion; one that asks
-- is counted here too, so a run that asked and was then killed is never left uncounted.
if not rec[7] or rec[7] == '0' then w[#w + 1], w[#w + 2] = 'runs', '1' end
if ARGV[5] ~= '0' then
  w[#w + 1], w[#w + 2] = 'ask_until_ms', ARGV[5]
else
  redis.call('HDEL', KEYS[1], 'ask_until_ms')
end
redis.call(unpack(w))
if rec[5] then announce(KEYS[1], 'input_required') end
return {AskCode_ASKED, new and 1 or 0}
