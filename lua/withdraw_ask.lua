-- withdraw_ask.lua: an ask's time is up (ctx.ask's timeout_s, reach/asking.py): take its
-- question back and set the task 'running' again, unless the answer came first, in one
-- step, so an answer stored at the last moment is never lost nor taken for a timeout.
--
-- KEYS[1] the message's idempotency record (a hash, or absent)
-- ARGV[1] owner: "<agent_id>/<instance_id>" of the run's claim, 1..1024 bytes
-- ARGV[2] fence: the fence of the run's claim (ctx.fence), integer 1..2^53
-- ARGV[3] n: the ask's number (as given to ask.lua), integer 1..2^53
-- Integers are plain decimal digits without sign or leading zero.
--
-- When the record is held by ARGV[1] with fence ARGV[2], is not done and ask n has no
-- answer: fields 'question', 'asking' and 'ask_until_ms' are deleted if 'asking' is n, and
-- status 'input_required' becomes 'running' (updated_ms; a watched record announces
-- 'running', lua/includes/announce.lua). A later answer.lua finds no ask waiting. The
-- record's TTL is kept.
--
-- Every argument, and the type of the key, is checked before the first write: a refused
-- call writes nothing.
--
-- Returns {code, value} (the codes: AskCode of lua/includes/codes.lua):
--   {3, ''}     withdrawn: no answer came
--   {2, bytes}  ask n has its answer (answer.lua stored it first): nothing written
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
  return arity(1, 3) or bytes_bad('owner', 1, 1, 1024)
    or int_bad('fence', 2, 1, MAX_INT)
    or int_bad('n', 3, 1, MAX_INT)
end

local err = check()
if err then return refuse(err) end
local rec = redis.pcall('HMGET', KEYS[1], 'owner', 'fence', 'done', 'status', 'asking',
  'watched', 'a:' .. ARGV[3])
if rec['err'] then
  return refuse('KEYS[1]: holds a ' .. redis.call('TYPE', KEYS[1])['ok'] .. ', want a hash')
end

if rec[1] ~= ARGV[1] or rec[2] ~= ARGV[2] or rec[3] == '1' then return {AskCode_FENCED, ''} end
if rec[7] then return {AskCode_ANSWERED, rec[7]} end
if rec[5] == ARGV[3] then
  redis.call('HDEL', KEYS[1], 'question', 'asking', 'ask_until_ms')
  if rec[4] == 'input_required' then
    redis.call('HSET', KEYS[1], 'status', 'running', 'updated_ms', now_ms())
    if rec[6] then announce(KEYS[1], 'running') end
  end
end
return {AskCode_WITHDRAWN, ''}
