-- count_agents.lua: count a namespace's agents by lease state, and the routable ones
-- (active, ready, not draining), reading at most ARGV[1] agent records: every record when
-- the agents zset holds that many or fewer, else a uniform random sample of ARGV[1]
-- distinct agents (ZRANDMEMBER with a positive count), which the caller scales by
-- total / looked. One call costs at most ARGV[1] record reads, whatever the fleet size:
-- the registry gauges' count (reach.metrics.count_agents) is one command per count.
-- Writes nothing.
--
-- Every key is of one registry shard, one hash slot: the namespace's counts are the sum
-- of one call per shard.
--
-- KEYS[1] agents zset (agent_id -> next deadline, epoch ms)
-- KEYS[2] agent-hash key prefix (agent ids are appended; same slot)
-- ARGV[1] most agent records to read: integer 1..100000
--
-- Every argument is checked before the first read of a record.
-- Integers are plain decimal digits (no sign, leading zero, exponent, hex, inf or nan).
--
-- Returns {total, looked, active, probation, evicted, routable, other}
--         total: agents in the zset (ZCARD); looked: the records read (total when
--         total <= ARGV[1], else ARGV[1]); other: ids read whose record is missing, is not
--         a hash, or has no known state (an id whose hash was deleted behind the scripts'
--         back, until the sweeper drops it).
-- Errors  'reach: bad <argument>: <why>' (an error reply; redis-py raises ResponseError)
--         when an argument, or the number of KEYS or ARGV, is out of contract, or KEYS[1]
--         holds another type than a zset.
--!include args
--!include key_types

local function check()
  local e = arity(2, 1)
  if e then return e end
  if not int(ARGV[1], 1, 100000) then
    return 'sample ' .. show(ARGV[1]) .. ': want an integer 1..100000'
  end
  return keys_typed({[1] = 'zset'})
end

local err = check()
if err then return refuse(err) end

local most = tonumber(ARGV[1])
local total = redis.call('ZCARD', KEYS[1])
local ids
if total <= most then
  ids = redis.call('ZRANGE', KEYS[1], 0, -1)
else
  ids = redis.call('ZRANDMEMBER', KEYS[1], most)
end

local active, probation, evicted, routable, other = 0, 0, 0, 0, 0
for _, id in ipairs(ids) do
  local s = redis.pcall('HMGET', KEYS[2] .. id, 'state', 'ready', 'draining')
  local state = (type(s) == 'table' and not s['err']) and s[1] or nil
  if state == 'active' then
    active = active + 1
    if s[2] == '1' and s[3] ~= '1' then routable = routable + 1 end
  elseif state == 'probation' then
    probation = probation + 1
  elseif state == 'evicted' then
    evicted = evicted + 1
  else
    other = other + 1
  end
end
return {total, #ids, active, probation, evicted, routable, other}
