-- answer.lua: answer the question a task's handler asked (client.answer, reach task answer,
-- the console, the A2A gateway): store the answer in the message's idempotency record, set
-- the task 'running' again and wake the handler waiting for it (reach/asking.py).
--
-- KEYS[1] the message's idempotency record (a hash, or absent)
-- ARGV[1] answer: JSON text, 1..AskBound_ANSWER_BYTES (65536) bytes
-- ARGV[2] n: the number of the ask it answers, integer 1..2^53, or '' for the ask waiting
-- Integers are plain decimal digits without sign or leading zero.
--
-- A task waits for an answer when its record is not done, its status is 'input_required'
-- (or 'running', 'pending', 'retrying': a run that asked was cut off, crashed or failed,
-- and the next run has not asked again yet) and its field 'asking' (ask.lua) names the
-- ask waiting; with ARGV[2], it must be that ask. Then the answer is stored in field
-- 'a:<n>', 'question', 'asking' and 'ask_until_ms' are deleted, status 'input_required'
-- becomes 'running' (updated_ms), and the new status is published on the record's channel
-- whether or not the record is watched (lua/includes/announce.lua): the handler that asked
-- listens there. The record's TTL is kept. An answer stays in the record as long as the
-- record lives, so every later run of the message gets it from ask.lua without asking.
--
-- Every argument, and the type of the key, is checked before the first write: a refused
-- call writes nothing.
--
-- Returns {code, value} (the codes: AnswerCode of lua/includes/codes.lua):
--   {1, n}       answered: the answer is stored as ask n's
--   {2, n}       ask n (ARGV[2], else the one waiting, else the last one asked) has its
--                answer already: the first one stays, nothing written
--   {0, status}  the task waits for no answer (status: the record's, '' if it has none)
--   {-1, ''}     no record: never sent, or expired
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of KEYS or ARGV, an argument, or the key's type is
--         out of contract.
local MAX_INT = 9007199254740992
local OPEN = {input_required = true, running = true, pending = true, retrying = true}

--!include args
--!include codes
--!include now
--!include announce

local function check()
  local why = arity(1, 2) or bytes_bad('answer', 1, 1, AskBound_ANSWER_BYTES)
  if why then return why end
  if ARGV[2] ~= '' then return int_bad('n', 2, 1, MAX_INT) end
  return nil
end

local err = check()
if err then return refuse(err) end
local rec = redis.pcall('HMGET', KEYS[1], 'done', 'status', 'asking', 'asked')
if rec['err'] then
  return refuse('KEYS[1]: holds a ' .. redis.call('TYPE', KEYS[1])['ok'] .. ', want a hash')
end
local done, status, asking, asked = rec[1], rec[2], rec[3], rec[4]
if not done and not status and redis.call('EXISTS', KEYS[1]) == 0 then
  return {AnswerCode_UNKNOWN, ''}
end

local n = ARGV[2] ~= '' and ARGV[2] or asking or asked
-- HMGET, not HEXISTS: the commands a caller's least-privilege user runs (reach/acl.py)
if n and redis.call('HMGET', KEYS[1], 'a:' .. n)[1] then
  return {AnswerCode_ALREADY, tonumber(n)}
end
if done == '1' or not OPEN[status or ''] or not asking or n ~= asking then
  return {AnswerCode_NOT_WAITING, status or ''}
end
redis.call('HSET', KEYS[1], 'a:' .. asking, ARGV[1])
redis.call('HDEL', KEYS[1], 'question', 'asking', 'ask_until_ms')
if status == 'input_required' then
  status = 'running'
  redis.call('HSET', KEYS[1], 'status', status, 'updated_ms', now_ms())
end
announce(KEYS[1], status)
return {AnswerCode_ANSWERED, tonumber(asking)}
