-- lease.lua: the lease renewal of one agent, shared by heartbeat.lua (one
-- agent) and heartbeat_many.lua (the agents of one process in one call).
--!include registry
--!include now
--!include codes
local MAX = 9007199254740991

-- The heartbeat arguments of one agent: agent_id, instance_id, version, queue_depth,
-- inflight, slots (its concurrency), handler_us (its handlers' recent mean run time).
-- Why the 7 heartbeat arguments at ARGV[p..p+6] are refused, or nil.
local function beat_bad(p)
  local e = agent_id_bad(ARGV[p])
  if e then return e end
  if #ARGV[p + 1] < 1 or #ARGV[p + 1] > 256 then return 'instance_id: want 1..256 bytes' end
  if not int(ARGV[p + 2], 0, MAX) then
    return 'version ' .. show(ARGV[p + 2]) .. ': want an integer 0..2^53-1'
  end
  if not int(ARGV[p + 3], 0, MAX) then
    return 'queue_depth ' .. show(ARGV[p + 3]) .. ': want an integer 0..2^53-1'
  end
  if not int(ARGV[p + 4], 0, MAX) then
    return 'inflight ' .. show(ARGV[p + 4]) .. ': want an integer 0..2^53-1'
  end
  if not int(ARGV[p + 5], 0, MAX) then
    return 'slots ' .. show(ARGV[p + 5]) .. ': want an integer 0..2^53-1'
  end
  if not int(ARGV[p + 6], 0, MAX) then
    return 'handler_us ' .. show(ARGV[p + 6]) .. ': want an integer 0..2^53-1'
  end
  return nil
end

-- Why cap_us, the per-capability mean run times an agent reports, is refused, or nil: ''
-- (none measured) or '<capability>=<µs>' items separated by one space, at most 65536
-- bytes, each capability 1..200 bytes of [a-z0-9_.], each µs an integer 0..2^53-1.
local function cap_us_bad(v)
  if #v > 65536 then return 'cap_us: want at most 65536 bytes' end
  if v == '' then return nil end
  local n = 0
  for item in string.gmatch(v, '[^ ]+') do
    n = n + #item + 1
    local cap, us = string.match(item, '^([a-z0-9_.]+)=(%d+)$')
    if not cap or #cap > 200 or not int(us, 0, MAX) then
      return 'cap_us ' .. show(item) .. ": want '<capability>=<integer µs>' items"
    end
  end
  if n ~= #v + 1 then return "cap_us: want items separated by one space" end
  return nil
end

-- Renew the lease of the agent whose (checked) arguments are at ARGV[p..p+6], its hash
-- `hash`, in agents zset `zset`; a recovery is written to events stream `events`.
-- cap_us (checked; nil: not reported, the record's field is left as it is) is written to
-- the record's field cap_us ('' deletes it).
-- Returns code, draining (HeartbeatCode).
local function beat(zset, hash, events, maxlen, p, now, cap_us)
  local id, instance = ARGV[p], ARGV[p + 1]
  local s = redis.call('HMGET', hash, 'version', 'state', 'lease_ms', 'draining', 'instance_id',
    'agent_id')
  if not s[1] then
    return HeartbeatCode_NOT_REGISTERED, 0
  end
  local version = tonumber(ARGV[p + 2])
  local stored = int(s[1], 0, MAX)
  -- A record this script cannot read is not a registration: re-registering replaces it.
  if not stored or s[6] ~= id then
    return HeartbeatCode_NOT_REGISTERED, 0
  end
  if stored > version then
    return HeartbeatCode_STALE, 0
  end
  if stored < version or s[2] == 'evicted' then
    return HeartbeatCode_NOT_REGISTERED, 0
  end
  if s[5] ~= instance then
    -- Same start stamp, another instance: it registered after this one and replaced it.
    return HeartbeatCode_STALE, 0
  end
  local lease = int(s[3], 1, DAY)
  if not lease or (s[2] ~= 'active' and s[2] ~= 'probation') then
    return HeartbeatCode_NOT_REGISTERED, 0
  end
  redis.call('HSET', hash, 'last_heartbeat_ms', now, 'queue_depth', ARGV[p + 3],
    'inflight', ARGV[p + 4], 'slots', ARGV[p + 5], 'handler_us', ARGV[p + 6])
  if cap_us == '' then
    redis.call('HDEL', hash, 'cap_us')
  elseif cap_us then
    redis.call('HSET', hash, 'cap_us', cap_us)
  end
  redis.call('ZADD', zset, now + lease, id)
  local draining = (s[4] == '1') and 1 or 0
  if s[2] == 'probation' then
    redis.call('HSET', hash, 'state', 'active', 'state_ms', now)
    event(events, maxlen, 'recovered', id, instance, now)
    return HeartbeatCode_RECOVERED, draining
  end
  return HeartbeatCode_RENEWED, draining
end
