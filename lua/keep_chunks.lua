-- keep_chunks.lua: keep chunk entries of a streaming handler (reach/_emitting.py) in its
-- message's kept-chunks stream, so that the stream can be resumed from any process
-- (Client.resume, reach/resume.py), bounded in chunks, bytes and time: past a bound the
-- oldest entries go, the newest stay. One call keeps one or more entries of one run, in
-- the order they were written (the worker sends those written since its last call).
--
-- KEYS[1] the message's idempotency record (a hash, or absent)
-- KEYS[2] its kept chunks (a stream, or absent), in the record's slot
-- ARGV[1] max chunks kept, integer 1..10^9
-- ARGV[2] max bytes kept (of entries), integer 1..2^40
-- ARGV[3] keep ms: the kept stream's TTL, renewed by each call that keeps, integer 1..30
--         days in ms
-- then per entry (1..256 of them) 3 values:
--   seq: the number in its run of the entry's first chunk (the entry's seq, from 0),
--        integer 0..2^53
--   n: the chunks in the entry, integer 1..65536
--   the chunk entry's bytes as written to the caller's reply stream (docs/protocol.md,
--   *Chunk*), 1..ChunkBound_ENTRY_BYTES bytes
-- Integers are plain decimal digits without sign or leading zero.
--
-- Chunks are numbered from 1 across runs: chunk k is the one a run numbers k - 1. The record
-- counts in 'chunks' the numbers kept so far (the highest, k), in 'chunks_from' the oldest
-- still held, in 'chunks_bytes' the bytes held. An entry is kept only if it holds a number
-- past 'chunks' (a redelivered message's new run starts again from 1: the numbers it
-- repeats are not kept again, the first run's stay, as a live caller keeps them) and does
-- not start past it (no run leaves a gap). It is added with the id '<last>-<first>': <last>
-- the number of its last chunk, <first> the first one it adds (earlier ones in it repeat
-- kept numbers; a reader drops them). Then, while the chunks held (chunks - chunks_from + 1)
-- or the bytes held pass their bound, the oldest entry is deleted: an entry larger than a
-- bound on its own is deleted too (nothing is held; 'chunks_from' is then 'chunks' + 1).
-- The stream gets PEXPIRE keep ms; the record's TTL is kept. A watched record announces
-- 'chunks:<last>' once per call (lua/includes/announce.lua), so a resume waiting for
-- chunks wakes. A record without 'chunks' whose stream exists (left by an earlier record
-- of the same key, whose TTL was longer) has that stream deleted first; a record with
-- 'chunks' whose stream is gone (it expired between two writes) holds none any more
-- ('chunks_from' = 'chunks' + 1, no bytes) before the entries are added.
-- A record that is done, or whose status is final (succeeded, expired, dead, cancelled,
-- failed: a resume ends there), or absent, keeps nothing: a run fenced out (cancelled, or
-- taken over by a run that finished) adds nothing after the end.
--
-- Every argument, and the type of KEYS[1], is checked before the first write: a refused
-- call writes nothing.
--
-- Returns {code, chunks, chunks_from} (the record's fields after the call; 0 when absent):
--   code 1 kept (at least one entry added), 0 nothing new (every number in the entries is
--   kept already, or they start past them), -1 closed (the record is done, its status
--   final, or it is absent): nothing written. (The codes: KeepCode of
--   lua/includes/codes.lua.)
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of KEYS or ARGV, an argument, or the key's type is
--         out of contract.
--!include args
--!include record
--!include codes
--!include announce
local MAX_SEQ, DAY_MS = 9007199254740992, 86400000
-- The statuses after which a task does not change (reach.watch.ENDS): a resume that read
-- one of them with the record's 'chunks' has every chunk there will be.
local ENDED = {succeeded = true, expired = true, dead = true, cancelled = true, failed = true}

local function check()
  if #KEYS ~= 2 or #ARGV < 6 or #ARGV > 3 + 3 * 256 or (#ARGV - 3) % 3 ~= 0 then
    return 'arguments: want 2 KEYS and 3 + 3 per entry (1..256 entries) ARGV, got ' .. #KEYS
      .. ' and ' .. #ARGV
  end
  local e = int_bad('max chunks', 1, 1, 1000000000) or int_bad('max bytes', 2, 1, 1099511627776)
    or int_bad('keep ms', 3, 1, 30 * DAY_MS)
  if e then return e end
  for p = 4, #ARGV, 3 do
    e = int_bad('seq', p, 0, MAX_SEQ) or int_bad('n', p + 1, 1, 65536)
      or bytes_bad('entry', p + 2, 1, ChunkBound_ENTRY_BYTES)
    if e then return e end
  end
  return read_record(1, 'status', 'done', 'chunks', 'chunks_from', 'chunks_bytes', 'watched')
end

local err = check()
if err then return refuse(err) end

local s = record(1, 'status', 'done', 'chunks', 'chunks_from', 'chunks_bytes', 'watched')
local kept = tonumber(s[3]) or 0
local from = tonumber(s[4]) or (kept + 1)
if s[2] == '1' or ENDED[s[1] or ''] or (not s[1] and redis.call('EXISTS', KEYS[1]) == 0) then
  return {KeepCode_CLOSED, kept, from}
end

local function fmt(x) return string.format('%.0f', x) end
local bytes, added = tonumber(s[5]) or 0, false
if kept > 0 and redis.call('EXISTS', KEYS[2]) == 0 then
  from, bytes = kept + 1, 0  -- it expired (keep ms passed without a write): none is held
end
for p = 4, #ARGV, 3 do
  local seq = tonumber(ARGV[p])
  local last = seq + tonumber(ARGV[p + 1])
  if last > kept and seq <= kept then
    if kept == 0 then
      redis.call('DEL', KEYS[2])
      bytes = 0
    end
    redis.call('XADD', KEYS[2], fmt(last) .. '-' .. fmt(kept + 1), 'r', ARGV[p + 2])
    bytes, kept, added = bytes + #ARGV[p + 2], last, true
  end
end
if not added then return {KeepCode_KNOWN, kept, from} end

local max_chunks, max_bytes = tonumber(ARGV[1]), tonumber(ARGV[2])
while from <= kept and (kept - from + 1 > max_chunks or bytes > max_bytes) do
  local oldest = redis.call('XREAD', 'COUNT', 1, 'STREAMS', KEYS[2], '0-0')
  local e = oldest and oldest[1] and oldest[1][2][1]
  if not e then break end  -- nothing left to delete
  redis.call('XDEL', KEYS[2], e[1])
  local fields = e[2]
  for i = 1, #fields, 2 do
    if fields[i] == 'r' then bytes = bytes - #fields[i + 1] end
  end
  from = tonumber(string.match(e[1], '^(%d+)')) + 1
end
if from > kept then bytes = 0 end
redis.call('HSET', KEYS[1], 'chunks', fmt(kept), 'chunks_from', fmt(from),
  'chunks_bytes', fmt(bytes))
redis.call('PEXPIRE', KEYS[2], ARGV[3])
if s[6] then announce(KEYS[1], 'chunks:' .. fmt(kept)) end
return {KeepCode_KEPT, kept, from}
