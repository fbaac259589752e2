-- mark_pending.lua: mark a sent message pending in its idempotency record (Redis Cluster:
-- send.lua's record part, run on the record's own slot once enqueue.lua or an XADD has
-- added the message to the inbox, which lives in another slot).
--
-- KEYS[1] the message's idempotency record (hash; also its task status)
-- ARGV[1] capability
-- ARGV[2] attempt, integer 0..999999999999999
-- ARGV[3] msg_id
-- ARGV[4] ttl_ms of the record, integer 1..31536000000 (365 days)
-- Integers are plain decimal digits without sign or leading zero.
--
-- As send.lua: the status of a done key (a duplicate send under a finished key must not
-- turn 'succeeded' back into 'pending') or a running one (or input_required) is kept; any other (dead,
-- failed, expired, retrying: the key was released and runs again) becomes 'pending', so
-- the last run's outcome is not read as this send's; a cancelled one stays cancelled when
-- this is a copy of the msg_id cancelled (cancel_of: a retry, a moved entry), so it is
-- never run; a new msg_id under the key runs again; capability, attempt and sent_msg_id
-- are written and the record lives ttl_ms from now. The msg_id -> idempotency key pointer
-- (send.lua's KEYS[3]) is in a third slot and holds no status: the client writes it with a
-- plain SET.
--
-- A run that got there first keeps its status: on a Cluster the inbox entry and this
-- script are on different nodes, so a worker may claim, run and settle the message before
-- this mark lands. A record with a fence (a claim was made) and no attempt (no send has
-- marked it: only this script and send.lua write attempt) is such a run's, and saying
-- 'pending' would be wrong for as long as the record lives.
--
-- A watched record made 'pending' again announces it (lua/includes/announce.lua).
--
-- Returns 1: the status is now 'pending'; 0: the record's status (done, running,
-- input_required, cancelled, or settled by a run before this mark), kept.
-- Errors  'ERR reach: bad <argument>: <why>' when an argument or the key's type is out of
--         contract; nothing is written then.
local MAX_TTL, MAX_INT = 31536000000, 999999999999999

--!include args
--!include key_types
--!include announce

local err = arity(1, 4) or int_bad('attempt', 2, 0, MAX_INT) or int_bad('ttl_ms', 4, 1, MAX_TTL)
  or keys_typed({'hash'})
if err then return refuse(err) end

local had = redis.call('HMGET', KEYS[1], 'done', 'cancel_of', 'status', 'watched', 'fence',
  'attempt')
local ran_first = had[5] and not had[6]
local marked = 0
if had[1] ~= '1' and had[3] ~= 'succeeded' and had[3] ~= 'running'
    and had[3] ~= 'input_required' and not ran_first
    and not (had[3] == 'cancelled' and had[2] == ARGV[3]) then
  redis.call('HSET', KEYS[1], 'status', 'pending')
  if had[4] then announce(KEYS[1], 'pending') end
  marked = 1
end
redis.call('HSET', KEYS[1], 'capability', ARGV[1], 'attempt', ARGV[2], 'sent_msg_id', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return marked
