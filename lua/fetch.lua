-- fetch.lua: read new entries of one agent's inbox, highest priority first, with a
-- starvation guard: a few slots are kept for normal and low while they have work, so a
-- flood of high never stops them. Non-blocking; the runtime blocks with XREADGROUP only
-- when this returns nothing.
--
-- KEYS[1] inbox stream, priority high
-- KEYS[2] inbox stream, priority normal
-- KEYS[3] inbox stream, priority low
-- ARGV[1] consumer group: 1..1024 bytes
-- ARGV[2] consumer name (the agent_id, so a restarted agent finds its pending entries):
--         1..1024 bytes
-- ARGV[3] n: entries wanted in all, integer 1..10000
-- ARGV[4] slots kept for normal (when it has entries): integer 0..n
-- ARGV[5] slots kept for low (when it has entries): integer 0..n
-- Integers are plain decimal digits without sign or leading zero.
--
-- Every argument is checked, and the group looked up on the three streams, before the
-- first read (XREADGROUP writes: it moves entries into the pending list): a refused call
-- reads and writes nothing.
--
-- Returns {high_entries, normal_entries, low_entries, normal_waiting, low_waiting}:
--   the entries of each priority, each a list of {id, {field, value...}}, and 1 for a lower
--   priority that got nothing although it has unread entries (it was passed over), else 0
-- Errors  NOGROUP (as Redis words it) when a stream or its group is missing: the runtime
--         recreates the groups and calls again;
--         'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of KEYS or ARGV, an argument, or a key's type is
--         out of contract. Only a bug or a hostile caller gets one.
local MAX_N = 10000

--!include args

local function check()
  local e = arity(3, 5) or bytes_bad('group', 1, 1, 1024) or bytes_bad('consumer', 2, 1, 1024)
    or int_bad('n', 3, 1, MAX_N)
  if e then return e end
  local n = tonumber(ARGV[3])
  return int_bad('slots kept for normal', 4, 0, n) or int_bad('slots kept for low', 5, 0, n)
end

local err = check()
if err then return refuse(err) end
-- A missing group (or stream) on the second or third stream must not fail the call after
-- the first read moved entries into the pending list: look all three up first.
-- (XPENDING with a count of 0: the lookup alone, an empty reply, where the summary form
-- would build one for Lua to convert.)
for i = 1, 3 do
  local r = redis.pcall('XPENDING', KEYS[i], ARGV[1], '-', '+', 0)
  if type(r) == 'table' and r['err'] then
    if string.find(r['err'], '^WRONGTYPE') then
      return refuse('KEYS[' .. i .. ']: not a stream, want an inbox stream')
    end
    return r
  end
end

local n = tonumber(ARGV[3])
-- The streams (by index) a read found short of what it asked: every unread entry of theirs
-- is read (nobody adds one while the script runs), so reading them again, or counting what
-- is left unread, can only find nothing.
local drained = {}
local function read(i, count)
  if count <= 0 or drained[i] then return {} end
  local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', count, 'STREAMS', KEYS[i], '>')
  local got = r and r[1][2] or {}
  if #got < count then drained[i] = true end
  return got
end
local function append(dst, src)
  for _, e in ipairs(src) do dst[#dst + 1] = e end
end
local keep_n, keep_l = tonumber(ARGV[4]), tonumber(ARGV[5])
local h = read(1, n - keep_n - keep_l)
local m = read(2, n - #h - keep_l)
local l = read(3, n - #h - #m)
local rest = n - #h - #m - #l
if rest > 0 then
  local more = read(1, rest)
  append(h, more)
  rest = rest - #more
  if rest > 0 then append(m, read(2, rest)) end
end
local function waiting(i, got)
  if #got > 0 or drained[i] then return 0 end
  local key = KEYS[i]
  local unread = redis.call('XLEN', key) - redis.call('XPENDING', key, ARGV[1])[1]
  return unread > 0 and 1 or 0
end
return {h, m, l, waiting(2, m), waiting(3, l)}
