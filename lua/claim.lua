-- claim.lua: take the idempotency keys of delivered messages before running their handlers.
-- Each record is a hash (one per key) that also carries the task status of its message.
-- Standalone Redis gets a whole batch in one call; on a Cluster the runtime sends one key
-- per call (pipelined), since the records live in different slots.
--
-- KEYS[1..n] idempotency records (hashes, or absent)
-- ARGV[1] owner: "<agent_id>/<instance_id>" of the claiming runtime, 1..1024 bytes
-- ARGV[2] ttl_ms: how long a record lives, integer 1..31536000000 (365 days)
-- ARGV[3] agent_id of the claiming agent, 1..1024 bytes
-- ARGV[2+2i] lease_ms for KEYS[i]: how long the claim holds without being completed,
--            integer 1..604800000 (7 days)
-- ARGV[3+2i] msg_id of the delivery that claims KEYS[i] (any bytes: stored as they are)
-- So #ARGV = 3 + 2 * #KEYS. Integers are plain decimal digits without sign or leading zero
-- (no '', spaces, exponent, hex, inf or nan).
--
-- Every argument, and the type of every key, is checked before the first write: a refused
-- call writes nothing. A record whose fence, runs or lease_until field is not a number
-- (written behind the scripts' back) is claimed anew: an unreadable lease counts as
-- expired, and the fence restarts from the server time in ms, above any fence handed out
-- before (one per claim), so a late completion of an earlier owner stays fenced.
--
-- Returns one reply per key, in order:
--   {1, fence}: claimed; run the handler, then complete with this fence token
--   {2, reply}: already done; reply with the stored bytes ('' if none was stored), do
--               not run again
--   {3, owner}: an unexpired claim holds the key (another runtime's, or this runtime's own
--               for another copy of the message still running); do not run this copy now
--         (the codes: ClaimCode of lua/includes/codes.lua)
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of ARGV, an argument, or a key's type is out of
--         contract. Only a bug or a hostile caller gets one: the runtime never sends such
--         a call.
local MAX_TTL, MAX_LEASE = 31536000000, 604800000

--!include args
--!include record
--!include codes

-- A stored counter HINCRBY can take (and whose increment stays exact in Lua).
local function counter_ok(v)
  return not v or v == '0' or (#v <= 15 and string.find(v, '^[1-9]%d*$') ~= nil)
end

local function check()
  local e = batch_arity(3, 2) or bytes_bad('owner', 1, 1, 1024)
    or int_bad('ttl_ms', 2, 1, MAX_TTL) or bytes_bad('agent_id', 3, 1, 1024)
  if e then return e end
  for i = 1, #KEYS do
    local a = 2 + 2 * i
    if not int_memo(ARGV[a], 1, MAX_LEASE) then
      return bad('lease_ms of KEYS[' .. i .. ']', a, 'want an integer 1..' .. MAX_LEASE)
    end
    e = read_record(i, 'done', 'reply', 'owner', 'lease_until', 'fence', 'runs')
    if e then return e end
  end
end

-- The answer for KEYS[i] (key), claimed at server time now if no one holds it.
local function claim(i, key, now)
  local s = record(i, 'done', 'reply', 'owner', 'lease_until', 'fence', 'runs')
  if s[1] == '1' then
    return {ClaimCode_REPLAY, s[2] or ''}
  elseif s[3] and s[3] ~= '' and (tonumber(s[4]) or 0) > now then
    return {ClaimCode_BUSY, s[3]}
  end
  if not counter_ok(s[5]) then redis.call('HSET', key, 'fence', now) end
  if not counter_ok(s[6]) then redis.call('HSET', key, 'runs', 0) end
  local fence = redis.call('HINCRBY', key, 'fence', 1)
  redis.call('HINCRBY', key, 'runs', 1)
  redis.call('HSET', key, 'owner', ARGV[1], 'lease_until', now + tonumber(ARGV[2 + 2 * i]),
    'status', 'running', 'msg_id', ARGV[3 + 2 * i], 'agent_id', ARGV[3], 'updated_ms', now)
  redis.call('PEXPIRE', key, ARGV[2])
  return {ClaimCode_RUN, fence}
end

return batch(check, claim)
