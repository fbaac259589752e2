-- record.lua: a batch over idempotency records (hashes), one per KEYS[i], in two passes:
-- the check pass reads each (a key of another type is refused before any write), the write
-- pass uses what it read.
--!include args
--!include now
local reads, seen = {}, {}

-- The check pass: read KEYS[i]'s fields (HMGET, kept for record(i)); returns why the key
-- is refused (it is not a hash), or nil.
local function read_record(i, ...)
  local s = redis.pcall('HMGET', KEYS[i], ...)
  if s['err'] then
    return 'KEYS[' .. i .. ']: holds a ' .. redis.call('TYPE', KEYS[i])['ok']
      .. ', want an idempotency record (a hash)'
  end
  reads[i] = s
  return nil
end

-- The write pass: KEYS[i]'s fields as the check pass read them, or read again when the
-- same key came earlier in KEYS (this batch has written it since).
local function record(i, ...)
  local key = KEYS[i]
  local s = reads[i]
  if seen[key] then s = redis.call('HMGET', key, ...) end
  seen[key] = true
  return s
end

-- Why a batch without head + each * #KEYS ARGV (each per key) is refused, or nil.
local function batch_arity(head, each)
  local want = head + each * #KEYS
  if #ARGV == want then return nil end
  return 'arguments: want ' .. head .. ' + ' .. each .. ' ARGV per key (' .. want .. ' for '
    .. #KEYS .. ' KEYS), got ' .. #ARGV
end

-- The reply of a batch: check() the whole call (read_record each key), and when it finds
-- nothing to refuse, write(i, KEYS[i], now) for each key in order, at server time now.
local function batch(check, write)
  local err = check()
  if err then return refuse(err) end
  local now, out = now_ms(), {}
  for i, key in ipairs(KEYS) do out[i] = write(i, key, now) end
  return out
end
