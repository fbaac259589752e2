-- reroute.lua: move a message its agent has not read yet to another agent's inbox, in one
-- step (Client(..., reroute_after_s=): docs/routing.md, "Moving a message a slow agent has
-- not started"). Standalone Redis only: the keys are of three slots (two inboxes and the
-- record), which one script may touch only on a single server.
--
-- KEYS[1] the inbox stream (agent and priority) the message was added to
-- KEYS[2] the message's idempotency record (hash; also its task status)
-- KEYS[3] the inbox stream of the new agent, same priority (one of KEYS[4..6])
-- KEYS[4..6] the new agent's three inbox streams (high, normal, low)
-- ARGV[1] the entry id in KEYS[1] ('<ms>-<seq>')
-- ARGV[2] max_queue: the new agent's bound on queued + in-flight messages, integer
--         0..999999999999999 (0 = unbounded)
-- ARGV[3] the new agent's id (kept in the record's agent_id), 1..1024 bytes
-- Integers are plain decimal digits without sign or leading zero.
--
-- The move happens only when the entry is still unread: it is in KEYS[1] and its id is
-- above the last id consumer group 'reach' delivered (or the group does not exist yet).
-- A worker only ever starts a message it read, and XREADGROUP moves the group's last id
-- atomically, so a message moved here is never started by its first agent: its entry is
-- gone (XDEL) in the same step as its copy is added (XADD of the same 'e' bytes, signature
-- and all, without the claim fields 'c' and 'l'). A record claimed at send for the first
-- agent loses that claim (owner and lease_until deleted, fence raised: a holder of the
-- old fence is fenced) and names the new agent; its status stays 'pending', so the new
-- agent claims it as any message (claim.lua).
--
-- Every argument, and the type of every key, is checked before the first write: a refused
-- call writes nothing.
--
-- Returns {1, new entry id}: moved
--         {0, ''}: the entry is not in KEYS[1] (settled, moved before, or never there)
--         {2, ''}: the entry was read by its agent (running, or about to): not moved
--         {3, depth}: the new agent's inbox holds max_queue entries or more: not moved
--         {4, status}: the record is done, cancelled, running or input_required (another copy of its
--                 key): not moved, its agent settles it
--         (the codes: RerouteCode of lua/includes/codes.lua)
-- Errors  'ERR reach: bad <argument>: <why>' when an argument, the number of KEYS or
--         ARGV, or a key's type is out of contract; nothing is written then.
local MAX_INT = 999999999999999

--!include args
--!include key_types
--!include now
--!include codes

local function check()
  local e = arity(6, 3)
  if e then return e end
  if not string.find(ARGV[1], '^%d+%-%d+$') or #ARGV[1] > 41 then
    return bad('entry id', 1, "want '<ms>-<seq>'")
  end
  e = int_bad('max_queue', 2, 0, MAX_INT) or bytes_bad('agent_id', 3, 1, 1024)
  if e then return e end
  if KEYS[3] ~= KEYS[4] and KEYS[3] ~= KEYS[5] and KEYS[3] ~= KEYS[6] then
    return 'KEYS[3]: not one of the inboxes KEYS[4..6]'
  end
  if KEYS[1] == KEYS[3] then return 'KEYS[3]: the same inbox as KEYS[1]' end
  return keys_typed({'stream', 'hash', 'stream', 'stream', 'stream', 'stream'})
end

-- Stream id a is above stream id b (both '<ms>-<seq>'; each part below 2^53 in practice).
local function above(a, b)
  local am, as = string.match(a, '^(%d+)%-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)%-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end

-- The last id group 'reach' of stream key delivered, or nil (no such group).
local function last_delivered(key)
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
    local f = {}
    for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
    if f['name'] == 'reach' then return f['last-delivered-id'] end
  end
  return nil
end

local err = check()
if err then return refuse(err) end

local id = ARGV[1]
local got = redis.call('XRANGE', KEYS[1], id, id)
if #got == 0 then return {RerouteCode_GONE, ''} end
local last = last_delivered(KEYS[1])
if last and not above(id, last) then return {RerouteCode_READ, ''} end

local rec = redis.call('HMGET', KEYS[2], 'done', 'fence', 'status')
local status = rec[3]
if rec[1] == '1' or status == 'cancelled' or status == 'running' or status == 'succeeded'
    or status == 'input_required' then
  return {RerouteCode_SETTLED, status or ''}
end

local max = tonumber(ARGV[2])
if max > 0 then
  local depth = 0
  for i = 4, 6 do depth = depth + redis.call('XLEN', KEYS[i]) end
  if depth >= max then return {RerouteCode_FULL, depth} end
end

local fields = got[1][2]
local env
for j = 1, #fields, 2 do
  if fields[j] == 'e' then env = fields[j + 1] end
end
if not env then return {RerouteCode_GONE, ''} end  -- not an envelope entry: its agent files it

local new = redis.call('XADD', KEYS[3], '*', 'e', env)
redis.call('XDEL', KEYS[1], id)
if status then
  local now = now_ms()
  redis.call('HDEL', KEYS[2], 'owner', 'lease_until')
  local fence = tonumber(rec[2] or '')
  if fence and fence >= 1 and fence < 9007199254740992 and fence == math.floor(fence) then
    redis.call('HSET', KEYS[2], 'fence', fence + 1)
  else  -- unreadable: restart above any fence handed out (claim.lua does the same)
    redis.call('HSET', KEYS[2], 'fence', now)
  end
  redis.call('HSET', KEYS[2], 'agent_id', ARGV[3], 'updated_ms', now)
end
return {RerouteCode_MOVED, new}
