-- complete.lua: settle claimed idempotency keys, each only if the caller still holds its
-- claim (fence token). Standalone Redis gets a batch in one call; a Cluster one key a call.
--
-- KEYS[1..n] idempotency records (hashes, or absent)
-- ARGV[1] ttl_ms: how long a record lives from now, integer 1..31536000000 (365 days)
-- for KEYS[i], j = 1 + 5 * (i - 1):
--   ARGV[j+1] fence token returned by claim.lua: integer 1..2^53
--   ARGV[j+2] task status: succeeded | failed | retrying | expired | dead
--   ARGV[j+3] reply bytes (the stored outcome), or ''
--   ARGV[j+4] mode: 'done' (final: later deliveries replay the stored reply) or
--             'release' (the key may be claimed and run again: retry, dead-letter replay)
--   ARGV[j+5] error text for the status ('' = none)
-- So #ARGV = 1 + 5 * #KEYS. Integers are plain decimal digits without sign or leading zero.
--
-- Every argument, and the type of every key, is checked before the first write: a refused
-- call writes nothing.
--
-- Returns one code per key, in order:
--   1: settled
--   0: fenced: another owner claimed the key since (this worker's claim ran out); nothing
--      was written and the caller must not reply or ack
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of ARGV, an argument, or a key's type is out of
--         contract. Only a bug or a hostile caller gets one: the runtime never sends such
--         a call.
local MAX_TTL, MAX_FENCE = 31536000000, 9007199254740992
local STATUSES = {succeeded = true, failed = true, retrying = true, expired = true, dead = true}
local MODES = {done = true, release = true}

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

local reads = {}

local function check()
  if #ARGV ~= 1 + 5 * #KEYS then
    return 'arguments: want 1 + 5 ARGV per key (' .. (1 + 5 * #KEYS) .. ' for ' .. #KEYS
      .. ' KEYS), got ' .. #ARGV
  end
  if not int(ARGV[1], 1, MAX_TTL) then
    return 'ttl_ms (ARGV[1]) ' .. show(ARGV[1]) .. ': want an integer 1..' .. MAX_TTL
  end
  for i = 1, #KEYS do
    local j = 1 + 5 * (i - 1)
    local of = ' of KEYS[' .. i .. '] (ARGV['
    if not int(ARGV[j + 1], 1, MAX_FENCE) then
      return 'fence' .. of .. (j + 1) .. ']) ' .. show(ARGV[j + 1]) .. ': want an integer 1..2^53'
    end
    if not STATUSES[ARGV[j + 2]] then
      return 'status' .. of .. (j + 2) .. ']) ' .. show(ARGV[j + 2])
        .. ': want succeeded, failed, retrying, expired or dead'
    end
    if not MODES[ARGV[j + 4]] then
      return 'mode' .. of .. (j + 4) .. ']) ' .. show(ARGV[j + 4]) .. ": want 'done' or 'release'"
    end
    -- Read each record now, so a key of another type is refused before any write.
    local s = redis.pcall('HMGET', KEYS[i], 'fence', 'done')
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
  local j = 1 + 5 * (i - 1)
  local s = reads[i]
  if seen[key] then  -- a second copy of a key in this batch: read what the first one wrote
    s = redis.call('HMGET', key, 'fence', 'done')
  end
  seen[key] = true
  if not s[1] or s[1] ~= ARGV[j + 1] or s[2] == '1' then
    out[i] = 0
  else
    redis.call('HSET', key, 'status', ARGV[j + 2], 'updated_ms', now, 'error', ARGV[j + 5],
      'owner', '', 'lease_until', 0)
    if ARGV[j + 4] == 'done' then
      redis.call('HSET', key, 'done', '1', 'reply', ARGV[j + 3])
    end
    redis.call('PEXPIRE', key, ARGV[1])
    out[i] = 1
  end
end
return out
