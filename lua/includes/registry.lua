-- registry.lua: what the registry scripts check and write alike.
--!include args
--!include key_types
local DAY = 86400000

-- Why an agent_id (1..256 bytes, no '{' or '}': ids go into key names) is refused, or nil.
local function agent_id_bad(v)
  if #v >= 1 and #v <= 256 and not string.find(v, '[{}]') then return nil end
  return 'agent_id: want 1..256 bytes, no braces'
end

-- Why an events stream max length (integer 1..10000000) is refused, or nil.
local function maxlen_bad(v)
  if int(v, 1, 10000000) then return nil end
  return 'events maxlen ' .. show(v) .. ': want an integer 1..10000000'
end

-- HMGET of agent hash `key`: agent_id, state, then the fields asked for; nil when the hash
-- holds no live registration of agent `id` (a record of another agent_id, or evicted).
local function registration(key, id, ...)
  local s = redis.call('HMGET', key, 'agent_id', 'state', ...)
  if s[1] ~= id or s[2] == 'evicted' then return nil end
  return s
end

-- Add a registry event of `kind` to the events stream, trimmed to about maxlen entries.
local function event(stream, maxlen, kind, agent_id, instance_id, now)
  redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
    'type', kind, 'agent_id', agent_id, 'instance_id', instance_id or '', 'ts', now)
end
