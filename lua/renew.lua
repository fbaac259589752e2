-- renew.lua: extend the claims of handlers still running, so that no other copy of their
-- messages is claimed while they run however long they take (reach/_worker/execution.py,
-- Execution.renew_claims). A claim's lease is otherwise fixed when it is made, and once it
-- ran out another copy of the key (a caller's resend, a copy parked by a newer process of
-- the same agent_id) would be claimed and run beside the first run.
-- Standalone Redis gets a batch in one call; on a Cluster the runtime sends one key per
-- call (pipelined), since the records live in different slots.
--
-- KEYS[1..n] idempotency records (hashes, or absent)
-- ARGV[1] owner: "<agent_id>/<instance_id>" of the runtime, 1..1024 bytes
-- then 2 ARGV per key; for KEYS[i], j = 2 * i - 1:
--   ARGV[j+1] lease_ms: the claim's lease from now, integer 1..604800000 (7 days)
--   ARGV[j+2] fence: the fence of the runtime's claim, integer 1..2^53
-- So #ARGV = 1 + 2 * #KEYS. Integers are plain decimal digits without sign or leading
-- zero.
--
-- A record is renewed when it is held by ARGV[1] with that fence and not done: its
-- lease_until becomes now + lease_ms, unless it already ends later (a renewal never
-- shortens a claim). Nothing else changes: not the status (a claim made at send stays
-- 'pending' until start.lua), the fence, runs or takeovers. Anything else is left as it
-- is: the key completed, was cancelled (cancel.lua raised the fence) or taken over (a
-- higher fence, another owner), or the record is gone; the run's fenced completion then
-- finds out.
--
-- Every argument, and the type of every key, is checked before the first write: a refused
-- call writes nothing.
--
-- Returns one integer per key, in order: 1 renewed, 0 left as it was.
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of KEYS or ARGV, an argument, or a key's type is
--         out of contract.
local MAX_LEASE, MAX_FENCE = 604800000, 9007199254740992

--!include args
--!include now

local reads = {}  -- each record's owner, fence, done and lease_until, as the check read them

local function check()
  if #KEYS < 1 or #ARGV ~= 1 + 2 * #KEYS then
    return 'arguments: want 1 KEYS or more and 1 + 2 per key ARGV, got ' .. #KEYS .. ' and '
      .. #ARGV
  end
  local e = bytes_bad('owner', 1, 1, 1024)
  if e then return e end
  for i = 1, #KEYS do
    local j = 2 * i - 1
    if not int_memo(ARGV[j + 1], 1, MAX_LEASE) then
      return bad('lease_ms of KEYS[' .. i .. ']', j + 1, 'want an integer 1..' .. MAX_LEASE)
    end
    if not int_memo(ARGV[j + 2], 1, MAX_FENCE) then
      return bad('fence of KEYS[' .. i .. ']', j + 2, 'want an integer 1..2^53')
    end
    -- Read here (kept for the write pass) instead of asked its TYPE: one command, and
    -- HMGET fails on exactly what is not a hash.
    local rec = redis.pcall('HMGET', KEYS[i], 'owner', 'fence', 'done', 'lease_until')
    if rec['err'] then
      return 'KEYS[' .. i .. ']: holds a ' .. redis.call('TYPE', KEYS[i])['ok']
        .. ', want a hash'
    end
    reads[i] = rec
  end
  return nil
end

local err = check()
if err then return refuse(err) end

local now = now_ms()
local out = {}
for i = 1, #KEYS do
  local j = 2 * i - 1
  local s = reads[i]
  if s[1] == ARGV[1] and s[2] == ARGV[j + 2] and s[3] ~= '1' then
    local until_ms = now + tonumber(ARGV[j + 1])
    local current = tonumber(s[4])
    if not current or current ~= current or current < until_ms then
      redis.call('HSET', KEYS[i], 'lease_until', until_ms)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
