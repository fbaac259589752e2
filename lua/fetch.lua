-- fetch.lua: read new entries of one agent's inbox, highest priority first, with a
-- starvation guard: a few slots are kept for normal and low while they have work, so a
-- flood of high never stops them. Non-blocking; the runtime blocks with XREADGROUP only
-- when this returns nothing.
--
-- KEYS[1] inbox stream, priority high
-- KEYS[2] inbox stream, priority normal
-- KEYS[3] inbox stream, priority low
-- ARGV[1] consumer group
-- ARGV[2] consumer name (the agent_id, so a restarted agent finds its pending entries)
-- ARGV[3] n: entries wanted in all
-- ARGV[4] slots kept for normal (when it has entries)
-- ARGV[5] slots kept for low (when it has entries)
--
-- Returns {high_entries, normal_entries, low_entries, normal_waiting, low_waiting}:
--   the entries of each priority, each a list of {id, {field, value...}}, and 1 for a lower
--   priority that got nothing although it has unread entries (it was passed over), else 0
-- Errors: NOGROUP when the group is missing (the runtime recreates it and calls again)
local n = tonumber(ARGV[3])
local function read(key, count)
  if count <= 0 then return {} end
  local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', count, 'STREAMS', key, '>')
  if r then return r[1][2] end
  return {}
end
local function append(dst, src)
  for _, e in ipairs(src) do dst[#dst + 1] = e end
end
local keep_n, keep_l = tonumber(ARGV[4]), tonumber(ARGV[5])
local h = read(KEYS[1], n - keep_n - keep_l)
local m = read(KEYS[2], n - #h - keep_l)
local l = read(KEYS[3], n - #h - #m)
local rest = n - #h - #m - #l
if rest > 0 then
  local more = read(KEYS[1], rest)
  append(h, more)
  rest = rest - #more
  if rest > 0 then append(m, read(KEYS[2], rest)) end
end
local function waiting(key, got)
  if #got > 0 then return 0 end
  local unread = redis.call('XLEN', key) - redis.call('XPENDING', key, ARGV[1])[1]
  return unread > 0 and 1 or 0
end
return {h, m, l, waiting(KEYS[2], m), waiting(KEYS[3], l)}
