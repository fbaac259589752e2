-- progress.lua: record how far a running handler has got (ctx.progress) in its message's
-- idempotency record and tell the task's watchers (client.watch), in one step, only while
-- the run that reports it still holds the record.
--
-- KEYS[1] the message's idempotency record (a hash, or absent)
-- ARGV[1] fence: the fence token of the reporting run (ctx.fence), integer 1..2^53
-- ARGV[2] fraction done: a decimal number 0..1 of at most 12 bytes ('0', '0.25', '1')
-- ARGV[3] note: what the handler is doing, 0..512 bytes ('' = none)
-- Integers are plain decimal digits without sign or leading zero.
--
-- The record takes the progress when its fence is ARGV[1], it is not done, and its status
-- is 'pending' (claimed at send, not confirmed running yet) or 'running': fields
-- 'progress' (ARGV[2]) and 'progress_note' (ARGV[3]; deleted when empty, so a record
-- without a note stays small), updated_ms; its TTL is kept. Then, if the record is
-- watched, the change is announced as 'progress:<fraction>:<note>'
-- (lua/includes/announce.lua).
-- Anything else (another run holds the record, it was cancelled, it finished, it is
-- absent) is left as it is: a late report of a run fenced out must not show.
--
-- Every argument, and the type of KEYS[1], is checked before the first write: a refused
-- call writes nothing.
--
-- Returns 1: recorded (and announced if watched); 0: left as it was.
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of KEYS or ARGV, an argument, or the key's type is
--         out of contract.
--!include args
--!include record
--!include now
--!include announce
local MAX_FENCE, MAX_NOTE = 9007199254740992, 512
local OPEN = {pending = true, running = true}

local function fraction_ok(v)
  if #v > 12 or not string.find(v, '^%d+%.?%d*$') then return false end
  local x = tonumber(v)
  return x ~= nil and x >= 0 and x <= 1
end

local function check()
  local why = arity(1, 3) or int_bad('fence', 1, 1, MAX_FENCE)
  if why then return why end
  if not fraction_ok(ARGV[2]) then
    return bad('fraction', 2, 'want a decimal number 0..1 of at most 12 bytes')
  end
  return bytes_bad('note', 3, 0, MAX_NOTE) or read_record(1, 'fence', 'done', 'status', 'watched')
end

local err = check()
if err then return refuse(err) end

local s = record(1, 'fence', 'done', 'status', 'watched')
if s[1] ~= ARGV[1] or s[2] == '1' or not OPEN[s[3] or ''] then return 0 end
redis.call('HSET', KEYS[1], 'progress', ARGV[2], 'updated_ms', now_ms())
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'progress_note', ARGV[3])
else
  redis.call('HDEL', KEYS[1], 'progress_note')
end
if s[4] then announce(KEYS[1], 'progress:' .. ARGV[2] .. ':' .. ARGV[3]) end
return 1
