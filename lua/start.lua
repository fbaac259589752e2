-- start.lua: confirm the claims send.lua made for this runtime (claiming at send) of
-- handlers still running a moment after they started (reach/_worker/execution.py,
-- MARK_RUNNING_AFTER_S): the task shows 'running' and the claim gets this runtime's own
-- lease, as claim.lua would have written them. The runtime does not wait for this to run
-- the handlers: the claim was already its own when it read them.
-- Standalone Redis only (send.lua claims at send only there): one call for a batch.
--
-- KEYS[1..n] idempotency records (hashes, or absent)
-- ARGV[1] owner: "<agent_id>/<instance_id>" of the runtime, 1..1024 bytes
-- ARGV[2] ttl_ms: how long a record lives, integer 1..31536000000 (365 days)
-- then 2 ARGV per key; for KEYS[i], j = 2 * i:
--   ARGV[j+1] lease_ms: the claim's new lease, from now, integer 1..604800000 (7 days)
--   ARGV[j+2] fence: the fence the entry's claim carries, integer 1..2^53
-- So #ARGV = 2 + 2 * #KEYS. Integers are plain decimal digits without sign or leading
-- zero.
--
-- A record is started when it is still 'pending', held by ARGV[1] with that fence, and not
-- done: status 'running', lease_until = now + lease_ms, updated_ms = now, runs 1 (its
-- first run, which send.lua's claim did not count), and it lives ttl_ms. A record whose
-- handler asked a question before this ran (ask.lua: status 'input_required', or 'running'
-- once answer.lua answered it), held the same way with its run not counted yet (no runs,
-- or runs 0),
-- gets the same but keeps its status and updated_ms. Anything else is left as it is: the handler's completion is done already (a
-- quick handler whose settle came first), or the claim is not this runtime's any more (a
-- record changed behind the scripts' back), which the fenced completion then finds.
--
-- A watched record started announces 'running' (lua/includes/announce.lua).
--
-- Every argument, and the type of every key, is checked before the first write: a refused
-- call writes nothing.
--
-- Returns one integer per key, in order: 1 started, 0 left as it was.
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of KEYS or ARGV, an argument, or a key's type is
--         out of contract.
local MAX_TTL, MAX_LEASE, MAX_FENCE = 31536000000, 604800000, 9007199254740992

--!include args
--!include now
--!include announce

local reads = {}  -- each record's owner, fence, done, status, watched and runs, as read

local function check()
  if #KEYS < 1 or #ARGV ~= 2 + 2 * #KEYS then
    return 'arguments: want 1 KEYS or more and 2 + 2 per key ARGV, got ' .. #KEYS .. ' and '
      .. #ARGV
  end
  local e = bytes_bad('owner', 1, 1, 1024) or int_bad('ttl_ms', 2, 1, MAX_TTL)
  if e then return e end
  for i = 1, #KEYS do
    local j = 2 * i
    if not int_memo(ARGV[j + 1], 1, MAX_LEASE) then
      return bad('lease_ms of KEYS[' .. i .. ']', j + 1, 'want an integer 1..' .. MAX_LEASE)
    end
    if not int_memo(ARGV[j + 2], 1, MAX_FENCE) then
      return bad('fence of KEYS[' .. i .. ']', j + 2, 'want an integer 1..2^53')
    end
    -- Read here (kept for the write pass) instead of asked its TYPE: one command, and
    -- HMGET fails on exactly what is not a hash.
    local rec = redis.pcall('HMGET', KEYS[i], 'owner', 'fence', 'done', 'status', 'watched',
      'runs')
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

-- Times written as decimal strings (Redis formats a Lua number anew at every call), each
-- lease end once per distinct lease_ms (the check pass parsed them: int_memo's table).
local t = now_ms()
local now = string.format('%.0f', t)
local ends = {}
local function lease_end(v)
  local e = ends[v]
  if not e then
    e = string.format('%.0f', t + parsed[v])
    ends[v] = e
  end
  return e
end
local out = {}
for i = 1, #KEYS do
  local j = 2 * i
  local s = reads[i]
  local held = s[1] == ARGV[1] and s[2] == ARGV[j + 2] and s[3] ~= '1'
  if held and (s[4] == 'pending' or not s[6] or s[6] == '0') then
    if s[4] == 'pending' then
      redis.call('HSET', KEYS[i], 'status', 'running', 'lease_until', lease_end(ARGV[j + 1]),
        'updated_ms', now, 'runs', '1')
      if s[5] then announce(KEYS[i], 'running') end
    else  -- it asked already (ask.lua), maybe was answered too: its status stays
      redis.call('HSET', KEYS[i], 'lease_until', lease_end(ARGV[j + 1]), 'runs', '1')
    end
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
