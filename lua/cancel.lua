-- cancel.lua: cancel a message that has not finished: mark its idempotency record
-- cancelled and fence out whoever runs it, in one step, unless it is over already.
-- Standalone Redis: the notice to the workers (KEYS[2]) is written in the same step. On a
-- Cluster the record and the notice stream live in different slots: the client calls this
-- with KEYS[1] only and adds the notice itself after a CANCELLED answer.
--
-- KEYS[1] the message's idempotency record (a hash, or absent)
-- KEYS[2] (optional) the namespace's cancel notices stream: XADD MAXLEN ~ maxlen *
--         m <msg_id> k <KEYS[1]>, written only when the answer is CANCELLED
-- ARGV[1] msg_id of the message cancelled, 1..1024 bytes (stored as 'cancel_of': a later
--         copy of that msg_id, a retry or a redelivery, stays cancelled; send.lua and
--         mark_pending.lua keep it so)
-- ARGV[2] error text stored with the status (who cancelled it, and why), 0..2000 bytes
-- ARGV[3] ttl_ms: how long the record lives from now, integer 1..31536000000 (365 days)
-- ARGV[4] maxlen of the notices stream, integer 1..10000000 (read only with KEYS[2])
-- Integers are plain decimal digits without sign or leading zero.
--
-- The rule (docs/concepts.md, Cancellation): a record that is scheduled, pending, retrying,
-- running or input_required (its handler waits for an answer, ask.lua) becomes 'cancelled' (error, updated_ms, cancel_of written), and its fence,
-- when it has one, goes up by one: the claim that runs it, or the claim send.lua made at
-- send, can no longer complete it (its completion is fenced; the entry stays pending, and
-- the next claim of it answers CANCELLED), and start.lua no longer confirms it. claim.lua answers
-- CANCELLED for a cancelled record, so a copy read later is never run. A record that is
-- done, or whose status says the message is over (succeeded, failed, expired, dead, or a
-- status these scripts do not write), is left as it is: a completed message cannot be
-- cancelled. A fence that is not a number restarts from the server time in ms (as
-- claim.lua does).
--
-- A watched record cancelled announces 'cancelled' (lua/includes/announce.lua).
--
-- Every argument, and the types of the keys, are checked before the first write: a
-- refused call writes nothing.
--
-- Returns {code, status}:
--   {1, status}: cancelled now; status: the one it had (scheduled, pending, retrying,
--         running or input_required)
--   {2, 'cancelled'}: it was cancelled already (nothing written, no notice)
--   {0, status}: over before the cancel (status: succeeded when done, else the stored one)
--   {-1, ''}: no record (never sent, or expired)
--         (the codes: CancelCode of lua/includes/codes.lua)
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of KEYS or ARGV, an argument, or a key's type is
--         out of contract.
--!include args
--!include record
--!include announce
--!include key_types
--!include codes
local MAX_TTL = 31536000000
local OPEN = {scheduled = true, pending = true, retrying = true, running = true,
  input_required = true}

local function check()
  if (#KEYS ~= 1 and #KEYS ~= 2) or #ARGV ~= 4 then
    return 'arguments: want 1 or 2 KEYS and 4 ARGV, got ' .. #KEYS .. ' and ' .. #ARGV
  end
  local e = bytes_bad('msg_id', 1, 1, 1024) or bytes_bad('error', 2, 0, 2000)
    or int_bad('ttl_ms', 3, 1, MAX_TTL)
  if e then return e end
  if #KEYS == 2 then
    e = int_bad('maxlen', 4, 1, 10000000)
    if e then return e end
    local why = key_type(KEYS[2], 'stream')
    if why then return 'KEYS[2]: ' .. why end
  end
  return read_record(1, 'done', 'fence', 'status', 'watched')
end

local err = check()
if err then return refuse(err) end

local done, fence, status, watched = unpack(record(1, 'done', 'fence', 'status', 'watched'))
if not done and not fence and not status then
  return {CancelCode_UNKNOWN, ''}
end
if done == '1' then return {CancelCode_DONE, status or 'succeeded'} end
if status == 'cancelled' then return {CancelCode_ALREADY_CANCELLED, status} end
if not OPEN[status or ''] then return {CancelCode_DONE, status or ''} end

local now = now_ms()
redis.call('HSET', KEYS[1], 'status', 'cancelled', 'error', ARGV[2], 'updated_ms', now,
  'cancel_of', ARGV[1])
if fence then
  local f = tonumber(fence)
  if not f or not string.find(fence, '^%d+$') or #fence > 15 then f = now end
  redis.call('HSET', KEYS[1], 'fence', string.format('%.0f', f + 1))
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if watched then announce(KEYS[1], 'cancelled') end
if #KEYS == 2 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'm', ARGV[1], 'k', KEYS[1])
end
return {CancelCode_CANCELLED, status}
