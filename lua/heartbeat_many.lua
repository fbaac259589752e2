-- heartbeat_many.lua: renew the leases of several agents of one registry shard in one call
-- (the agents a process hosts) and report their load; heartbeat.lua for each, at once.
--
-- Every key is of one registry shard, one hash slot (docs/protocol.md, "Registry shards"):
-- the agents of a call are agents of that shard; a process hosting agents of several
-- shards makes one call per shard.
--
-- KEYS[1] agents zset (agent_id -> next lease deadline, epoch ms)
-- KEYS[2] registry events stream
-- KEYS[2+i] the hash of the i-th agent (i = 1..n)
-- ARGV[1] events stream max length (approximate): integer 1..10000000
-- ARGV[2+7(i-1)..8+7(i-1)] the i-th agent, as ARGV[1..7] of heartbeat.lua:
--         agent_id (1..256 bytes, no '{' or '}'), instance_id (1..256 bytes),
--         version (integer 0..2^53-1), queue depth (integer 0..2^53-1),
--         handlers in flight (integer 0..2^53-1), slots (its concurrency, integer
--         0..2^53-1), handler_us (mean handler run time, µs, integer 0..2^53-1)
--         or, with 8 ARGV per agent (ARGV[2+8(i-1)..9+8(i-1)]), those 7 and cap_us, as
--         heartbeat.lua's ARGV[9] (every agent of a call has 7, or every one has 8)
-- n is 1..1000; KEYS[2+i] must be the hash of the i-th agent_id (the caller builds both).
--
-- Every argument of every agent is checked before the first write: a refused call writes
-- nothing, for no agent. One server time (TIME) for the whole call.
--
-- Returns a flat array, two entries per agent in ARGV order: code, draining, where code is
-- heartbeat.lua's for that agent: 1 renewed, 2 recovered (from probation), 0 not
-- registered (register again), -1 stale (a newer registration of this agent_id exists);
-- draining 1 when an operator asked the agent to drain (HeartbeatCode of
-- lua/includes/codes.lua).
-- Errors  'reach: bad <argument>: <why>' (an error reply; redis-py raises ResponseError)
--         when an argument, or the number of KEYS or ARGV, is out of contract (the agent's
--         position named), or a key holds another type than the one above.
--!include lease

local each = 7  -- ARGV per agent: 7, or 8 with cap_us

local function check()
  local n = #KEYS - 2
  if n >= 1 and #ARGV == 1 + 8 * n then each = 8 end
  if n < 1 or n > 1000 or #ARGV ~= 1 + each * n then
    return 'arguments: want 2+n KEYS and 1+7n (or 1+8n) ARGV (n 1..1000), got ' .. #KEYS
      .. ' and ' .. #ARGV
  end
  local e = maxlen_bad(ARGV[1])
  if e then return e end
  local wanted = {[1] = 'zset', [2] = 'stream'}
  for i = 1, n do
    e = beat_bad(2 + each * (i - 1)) or (each == 8 and cap_us_bad(ARGV[9 + 8 * (i - 1)]))
    if e then return 'agent ' .. i .. ': ' .. e end
    wanted[2 + i] = 'hash'
  end
  return keys_typed(wanted)
end

local err = check()
if err then return refuse(err) end

local now = now_ms()
local out = {}
for i = 1, #KEYS - 2 do
  local p = 2 + each * (i - 1)
  local code, draining = beat(KEYS[1], KEYS[2 + i], KEYS[2], ARGV[1], p, now,
    each == 8 and ARGV[p + 7] or nil)
  out[#out + 1] = code
  out[#out + 1] = draining
end
return out
