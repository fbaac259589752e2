-- claim.lua: take the idempotency keys of delivered messages before running their handlers,
-- or take one over from an owner judged gone.
-- Each record is a hash (one per key) that also carries the task status of its message.
-- Standalone Redis gets a whole batch in one call; on a Cluster the runtime sends one key
-- per call (pipelined), since the records live in different slots.
--
-- KEYS[1..n] idempotency records (hashes, or absent)
-- ARGV[1] owner: "<agent_id>/<instance_id>" of the claiming runtime, 1..1024 bytes
-- ARGV[2] ttl_ms: how long a record lives, integer 1..31536000000 (365 days)
-- ARGV[3] agent_id of the claiming agent, 1..1024 bytes
-- ARGV[4] max_takeovers: how many times a run that never ended (its owner killed, evicted,
--         stalled) may be taken over, integer 0..1000000; the next takeover poisons the key
-- then 3 ARGV per key; for KEYS[i], j = 1 + 3 * i:
--   ARGV[j+1] lease_ms: how long the claim holds without being completed, integer
--             1..604800000 (7 days)
--   ARGV[j+2] msg_id of the delivery that claims KEYS[i] (any bytes: stored as they are)
--   ARGV[j+3] takeover_from: '' for a plain claim; else the owner "<agent_id>/<instance_id>"
--             the caller read from the record and judged gone (dead, restarted, evicted;
--             any bytes): a claim of exactly that owner does not hold the key, even with
--             its lease unexpired
-- So #ARGV = 4 + 3 * #KEYS. Integers are plain decimal digits without sign or leading zero
-- (no '', spaces, exponent, hex, inf or nan).
--
-- A key is claimed unless it is done (REPLAY), cancelled (CANCELLED), or an unexpired
-- claim of another owner holds it (BUSY). With takeover_from, a claim of that owner is ended and the key claimed
-- in the same call (one round trip: before this option, a separate takeover script ended
-- the claim and claim.lua was called again). The comparison is with the record's owner
-- at the time of the call, so another runtime that took the key over after the caller
-- read the owner keeps its fresh claim: the answer is BUSY with that runtime as owner (a
-- read-then-write from the client would be that race). Taking over never skips a done
-- key, and the new claim's fence is higher, so the old owner's late completion is fenced.
--
-- A claim writes fence, runs, owner, lease_until, status 'running', agent_id, updated_ms,
-- msg_id (not for a record named by that msg_id: its readers take the name's) and
-- takeovers (only when not 0: absent reads as 0), and deletes sent_msg_id when it is the
-- msg_id claimed (absent reads as msg_id): fewer fields, a smaller record.
--
-- Takeovers are counted in the record's 'takeovers' field: a claim over an owner's claim
-- that was never completed (owner set: a run started, killed or stuck, never settled;
-- expired or taken over from; a claim send.lua made counts too, its run possibly started
-- and not confirmed yet: start.lua never runs on a stuck event loop) counts one; 'runs'
-- counts only the runs known to have started. The claim that would make it more than
-- max_takeovers does not run the message: the record is settled 'dead' in the same call
-- (owner cleared, fence raised so the stuck run's late completion is fenced) and the
-- answer is POISONED, for the caller to dead-letter it. A later new claim of the key (a
-- replay of the dead letter) runs again; its own takeovers count on.
--
-- A claim of a watched record announces 'running', a poisoned one 'dead'
-- (lua/includes/announce.lua).
--
-- Every argument, and the type of every key, is checked before the first write: a refused
-- call writes nothing. A record whose fence, runs or lease_until field is not a number
-- (written behind the scripts' back) is claimed anew: an unreadable lease counts as
-- expired, and the fence restarts from the server time in ms, above any fence handed out
-- before (one per claim), so a late completion of an earlier owner stays fenced.
--
-- Returns one reply per key, in order:
--   {1, fence}: claimed; run the handler, then complete with this fence token
--   {2, reply, status, agent_id, msg_id}: already done; do not run again, reply with the
--               stored reply ('' if none was stored): its bytes and the record's status,
--               agent_id and msg_id ('' each when absent), from which the reply is rebuilt
--               (docs/protocol.md, *Stored reply*; a record written by protocol version 1
--               stores the whole reply instead)
--   {3, owner}: an unexpired claim holds the key (another runtime's, or this runtime's own
--               for another copy of the message still running), and its owner is not
--               takeover_from; do not run this copy now
--   {4, ''}: the message was cancelled (cancel.lua: status 'cancelled'), before or while
--            it ran: do not run it; settle it as cancelled (nothing is written here)
--   {5, runs, takeovers}: poisoned: its runs were taken over max_takeovers times and this
--            claim would be one more: not claimed, the record is settled 'dead' here;
--            runs as the record counts them, takeovers with this one: how many claims of
--            the key never ended. Do not run it, dead-letter it
--         (the codes: ClaimCode of lua/includes/codes.lua)
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of ARGV, an argument, or a key's type is out of
--         contract. Only a bug or a hostile caller gets one: the runtime never sends such
--         a call.
local MAX_TTL, MAX_LEASE = 31536000000, 604800000

--!include args
--!include record
--!include codes
--!include announce

-- A stored counter HINCRBY can take (and whose increment stays exact in Lua).
local function counter_ok(v)
  return not v or v == '0' or (#v <= 15 and string.find(v, '^[1-9]%d*$') ~= nil)
end

local function check()
  local e = batch_arity(4, 3) or bytes_bad('owner', 1, 1, 1024)
    or int_bad('ttl_ms', 2, 1, MAX_TTL) or bytes_bad('agent_id', 3, 1, 1024)
    or int_bad('max_takeovers', 4, 0, 1000000)
  if e then return e end
  for i = 1, #KEYS do
    local a = 2 + 3 * i
    if not int_memo(ARGV[a], 1, MAX_LEASE) then
      return bad('lease_ms of KEYS[' .. i .. ']', a, 'want an integer 1..' .. MAX_LEASE)
    end
    e = read_record(i, 'done', 'reply', 'owner', 'lease_until', 'fence', 'runs', 'takeovers',
      'agent_id', 'msg_id', 'sent_msg_id', 'status', 'watched')
    if e then return e end
  end
end

-- Whether record `key` is named by msg_id (reach:<ns>:{i:<msg_id>}:idem: a message sent
-- without a caller's key), which its readers then take from the name.
local function named_by(key, msg_id)
  local suffix = '{i:' .. msg_id .. '}:idem'
  local head = #key - #suffix
  return head > 0 and string.sub(key, head + 1) == suffix
    and not string.find(string.sub(key, 1, head), '{', 1, true)
end

-- The answer for KEYS[i] (key), claimed at server time now if no one holds it.
local function claim(i, key, now)
  local s = record(i, 'done', 'reply', 'owner', 'lease_until', 'fence', 'runs', 'takeovers',
    'agent_id', 'msg_id', 'sent_msg_id', 'status', 'watched')
  if s[1] == '1' then
    -- The record's status, agent_id and msg_id too: the short stored form leaves them out.
    return {ClaimCode_REPLAY, s[2] or '', s[11] or '', s[8] or '', s[9] or ''}
  end
  if s[11] == 'cancelled' then
    return {ClaimCode_CANCELLED, ''}
  end
  local owner, from = s[3], ARGV[4 + 3 * i]
  if owner and owner ~= '' and (tonumber(s[4]) or 0) > now and (from == '' or owner ~= from) then
    return {ClaimCode_BUSY, owner}
  end
  -- The counters as HINCRBY would count them, in the one HSET of the claim (their values
  -- have at most 15 digits, so the sums are exact and '%.0f' writes them as integers).
  local fence = (counter_ok(s[5]) and (tonumber(s[5]) or 0) or now) + 1
  local ran = counter_ok(s[6]) and (tonumber(s[6]) or 0) or 0
  local takeovers = counter_ok(s[7]) and (tonumber(s[7]) or 0) or 0
  if owner and owner ~= '' then  -- a claim never completed: a run that never ended
    takeovers = takeovers + 1
    if takeovers > tonumber(ARGV[4]) then
      local n = string.format('%.0f', takeovers)
      redis.call('HSET', key, 'fence', string.format('%.0f', fence), 'owner', '',
        'lease_until', 0, 'status', 'dead', 'msg_id', ARGV[3 + 3 * i],
        'agent_id', ARGV[3], 'updated_ms', now, 'takeovers', n,
        'error', 'poisoned: ' .. n .. ' runs never finished')
      redis.call('PEXPIRE', key, ARGV[2])
      if s[12] then announce(key, 'dead') end
      return {ClaimCode_POISONED, ran, takeovers}
    end
  end
  local runs, msg_id = ran + 1, ARGV[3 + 3 * i]
  local w = {'HSET', key, 'fence', string.format('%.0f', fence),
    'runs', string.format('%.0f', runs), 'owner', ARGV[1],
    'lease_until', now + tonumber(ARGV[2 + 3 * i]), 'status', 'running',
    'agent_id', ARGV[3], 'updated_ms', now}
  -- Fields that would say what is known without them are left out (every field costs
  -- memory in each record): takeovers 0; msg_id when the record is named by it; and
  -- sent_msg_id when it is the msg_id claimed. Absent, each reads as that.
  if takeovers > 0 or s[7] then
    w[#w + 1], w[#w + 2] = 'takeovers', string.format('%.0f', takeovers)
  end
  local gone = {}
  if named_by(key, msg_id) then
    if s[9] then gone[#gone + 1] = 'msg_id' end
  else
    w[#w + 1], w[#w + 2] = 'msg_id', msg_id
  end
  if s[10] == msg_id then gone[#gone + 1] = 'sent_msg_id' end
  redis.call(unpack(w))
  if #gone > 0 then redis.call('HDEL', key, unpack(gone)) end
  redis.call('PEXPIRE', key, ARGV[2])
  if s[12] then announce(key, 'running') end
  return {ClaimCode_RUN, fence}
end

return batch(check, claim)
