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
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of ARGV, an argument, or a key's type is out of
--         contract. Only a bug or a hostile caller gets one: the runtime never sends such
--         a call.
local MAX_TTL, MAX_LEASE = 31536000000, 604800000

local function show(v)
  return (string.gsub(string.sub(tostring(v), 1, 40), '[^%w%.%+%-_ ]', '?'))
end

-- A plain decimal integer as the runtime sends it ('0' or digits without a leading zero),
-- in lo..hi; nil for anything else. Parsed once per distinct string (a batch repeats them).
local parsed = {}
local function int(v, lo, hi)
  local n = parsed[v]
  if n == nil then
    n = false
    if #v <= 16 and (v == '0' or string.find(v, '^[1-9]%d*$')) then n = tonumber(v) end
    parsed[v] = n
  end
  if not n or n < lo or n > hi then return nil end
  return n
end

-- A stored counter HINCRBY can take (and whose increment stays exact in Lua).
local function counter_ok(v)
  return not v or v == '0' or (#v <= 15 and string.find(v, '^[1-9]%d*$') ~= nil)
end

local reads = {}

local function check()
  if #ARGV ~= 3 + 2 * #KEYS then
    return 'arguments: want 3 + 2 ARGV per key (' .. (3 + 2 * #KEYS) .. ' for ' .. #KEYS
      .. ' KEYS), got ' .. #ARGV
  end
  if #ARGV[1] < 1 or #ARGV[1] > 1024 then return 'owner (ARGV[1]): want 1..1024 bytes' end
  if not int(ARGV[2], 1, MAX_TTL) then
    return 'ttl_ms (ARGV[2]) ' .. show(ARGV[2]) .. ': want an integer 1..' .. MAX_TTL
  end
  if #ARGV[3] < 1 or #ARGV[3] > 1024 then return 'agent_id (ARGV[3]): want 1..1024 bytes' end
  for i = 1, #KEYS do
    local a = 2 + 2 * i
    if not int(ARGV[a], 1, MAX_LEASE) then
      return 'lease_ms of KEYS[' .. i .. '] (ARGV[' .. a .. ']) ' .. show(ARGV[a])
        .. ': want an integer 1..' .. MAX_LEASE
    end
    -- Read each record now, so a key of another type is refused before any write.
    local s = redis.pcall('HMGET', KEYS[i], 'done', 'reply', 'owner', 'lease_until', 'fence', 'runs')
    if s['err'] then
      return 'KEYS[' .. i .. ']: holds a ' .. redis.call('TYPE', KEYS[i])['ok']
        .. ', want an idempotency record (a hash)'
    end
    reads[i] = s
  end
  return nil
end

local err = check()
if err then return redis.error_reply('ERR reach: bad ' .. err) end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out, seen = {}, {}
for i, key in ipairs(KEYS) do
  local s = reads[i]
  if seen[key] then  -- a second copy of a key in this batch: read what the first one wrote
    s = redis.call('HMGET', key, 'done', 'reply', 'owner', 'lease_until', 'fence', 'runs')
  end
  seen[key] = true
  if s[1] == '1' then
    out[i] = {2, s[2] or ''}
  elseif s[3] and s[3] ~= '' and (tonumber(s[4]) or 0) > now then
    out[i] = {3, s[3]}
  else
    if not counter_ok(s[5]) then redis.call('HSET', key, 'fence', now) end
    if not counter_ok(s[6]) then redis.call('HSET', key, 'runs', 0) end
    local fence = redis.call('HINCRBY', key, 'fence', 1)
    redis.call('HINCRBY', key, 'runs', 1)
    redis.call('HSET', key, 'owner', ARGV[1], 'lease_until', now + tonumber(ARGV[2 + 2 * i]),
      'status', 'running', 'msg_id', ARGV[3 + 2 * i], 'agent_id', ARGV[3], 'updated_ms', now)
    redis.call('PEXPIRE', key, ARGV[2])
    out[i] = {1, fence}
  end
end
return out
