-- sweep.lua: move agents whose lease ran out along the lease state machine.
--   active    --(no heartbeat for lease_ms)-->        probation  (event 'unstable')
--   probation --(no heartbeat for evict_after_ms)-->  evicted    (event 'evicted';
--             removed from its capability sets; the hash is kept as a shadow record)
--   evicted   --(shadow_ttl_ms later)-->              deleted
-- The agents zset scores each agent by its next deadline, so one sweep reads only the
-- agents that are due: its cost follows the number of changes, not of agents.
--
-- Every key is of one registry shard, one hash slot (docs/protocol.md, "Registry shards"):
-- each shard is swept by its own call, under its own lock.
--
-- KEYS[1] agents zset (agent_id -> next deadline, epoch ms)
-- KEYS[2] caps zset (capability -> number of agents declaring it)
-- KEYS[3] registry events stream
-- KEYS[4] sweeper lock
-- KEYS[5] capability-set key prefix (capability names are appended; same slot)
-- KEYS[6] agent-hash key prefix (agent ids are appended; same slot)
-- KEYS[7] reroute set: evicted agents are added, so their inboxes get moved to live agents
--         even if the runtime that swept crashes before moving them
-- ARGV[1] sweeper owner id (any runtime; the lock keeps the others idle): 1..256 bytes
-- ARGV[2] lock ttl ms (0 = sweep without taking the lock): integer 0..3600000 (1 hour)
-- ARGV[3] shadow_ttl_ms: integer 1..2592000000 (30 days)
-- ARGV[4] max agents to look at in this call: integer 1..100000
-- ARGV[5] events stream max length (approximate): integer 1..10000000
--
-- Every argument is checked before the first write: a refused call writes nothing.
-- Integers are plain decimal digits (no sign, leading zero, exponent, hex, inf or nan).
-- A record whose timing fields are not finite numbers (written behind the scripts' back)
-- is evicted when due, and no record's deadline is put further than 2 days ahead, so one
-- bad record neither stops the sweep nor stays registered for ever. A due id whose key is
-- not a hash is dropped from the agents zset; a capability set of another type is passed
-- over.
--
-- Returns {-1}: another runtime holds the sweeper lock
--         {n_due, n_probation, n_evicted, n_deleted, evicted_id...}
--         (n_due == ARGV[4] means more may be due: call again)
--         (the codes: SweepCode of lua/includes/codes.lua)
-- Errors  'reach: bad <argument>: <why>' (an error reply; redis-py raises ResponseError)
--         when an argument, or the number of KEYS or ARGV, is out of contract, or one of
--         KEYS[1..4] and KEYS[7] holds another type than the one above.
--!include registry
--!include caps
--!include now
--!include codes

local function finite(x)
  return x ~= nil and x == x and x > -math.huge and x < math.huge
end

local function check()
  local e = arity(7, 5)
  if e then return e end
  if #ARGV[1] < 1 or #ARGV[1] > 256 then return 'owner: want 1..256 bytes' end
  if not int(ARGV[2], 0, 3600000) then return 'lock_ms ' .. show(ARGV[2]) .. ': want an integer 0..3600000' end
  if not int(ARGV[3], 1, 30 * DAY) then
    return 'shadow_ttl_ms ' .. show(ARGV[3]) .. ': want an integer 1..2592000000'
  end
  if not int(ARGV[4], 1, 100000) then return 'batch ' .. show(ARGV[4]) .. ': want an integer 1..100000' end
  return maxlen_bad(ARGV[5])
    or keys_typed({[1] = 'zset', [2] = 'zset', [3] = 'stream', [4] = 'string', [7] = 'set'})
end

local err = check()
if err then return refuse(err) end

if tonumber(ARGV[2]) > 0 then
  local holder = redis.call('GET', KEYS[4])
  if holder and holder ~= ARGV[1] then
    return {SweepCode_LOCKED}
  end
  redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[2])
end
local now = now_ms()
local shadow_ttl = tonumber(ARGV[3])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
local n_prob, n_evict, n_del = 0, 0, 0
local evicted = {}

for _, id in ipairs(due) do
  local h = KEYS[6] .. id
  local s = {}
  local not_a_record = key_type(h, 'hash')  -- e.g. a string written under a record's name
  if not not_a_record then
    s = redis.call('HMGET', h, 'state', 'last_heartbeat_ms', 'evict_after_ms', 'caps', 'instance_id')
  end
  if not_a_record or (not s[1] and redis.call('EXISTS', h) == 0) then
    redis.call('ZREM', KEYS[1], id)
    n_del = n_del + 1
  elseif s[1] == 'evicted' then
    redis.call('DEL', h)
    redis.call('ZREM', KEYS[1], id)
    n_del = n_del + 1
  else
    local hb, ev = tonumber(s[2]), tonumber(s[3])
    local evict_at = now  -- unreadable timing: evict now
    if finite(hb) and finite(ev) then
      evict_at = math.min(math.max(hb + ev, 0), now + 2 * DAY)
    end
    if evict_at <= now then
      leave_caps(s[4], id, KEYS[5], KEYS[2])
      redis.call('HSET', h, 'state', 'evicted', 'ready', '0', 'state_ms', now)
      redis.call('PEXPIRE', h, shadow_ttl)
      redis.call('ZADD', KEYS[1], now + shadow_ttl, id)
      redis.call('SADD', KEYS[7], id)
      event(KEYS[3], ARGV[5], 'evicted', id, s[5], now)
      n_evict = n_evict + 1
      evicted[#evicted + 1] = id
    elseif s[1] == 'active' then
      redis.call('HSET', h, 'state', 'probation', 'state_ms', now)
      redis.call('ZADD', KEYS[1], evict_at, id)
      event(KEYS[3], ARGV[5], 'unstable', id, s[5], now)
      n_prob = n_prob + 1
    else
      redis.call('ZADD', KEYS[1], evict_at, id)
    end
  end
end
local out = {#due, n_prob, n_evict, n_del}
for _, id in ipairs(evicted) do out[#out + 1] = id end
return out
