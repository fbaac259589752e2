-- drain.lua: mark an agent as draining: routing stops sending it new work; the agent
-- finishes what it holds, then deregisters (it learns of the flag on its next heartbeat).
--
-- KEYS[1] the agent's hash
-- KEYS[2] registry events stream
-- ARGV[1] agent_id: 1..256 bytes, no '{' or '}'
-- ARGV[2] events stream max length (approximate): integer 1..10000000
-- ARGV[3] (optional) instance_id: drain only this instance's registration; '' or absent =
--         whatever instance is registered (an operator's drain). 0..256 bytes
--
-- Every argument is checked before the first write: a refused call writes nothing.
-- Integers are plain decimal digits (no sign, leading zero, exponent, hex, inf or nan).
--
-- Returns 1: now draining; 2: was already draining;
--         0: no such live agent (none, evicted, or a stored record of another agent_id);
--         -1: another instance owns the registration (ARGV[3] given): nothing changed, so
--             a stale process stopping never drains the newer one that replaced it
-- Errors  'reach: bad <argument>: <why>' (an error reply; redis-py raises ResponseError)
--         when an argument, or the number of KEYS or ARGV, is out of contract, or a key
--         holds another type than the one above.
local function show(v)
  return (string.gsub(string.sub(tostring(v), 1, 40), '[^%w%.%+%-_ ]', '?'))
end

-- A key of another type (written behind the scripts' back) would fail a command half-way
-- through the writes: refuse before the first one.
local function key_type(key, want)
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= want then return 'holds a ' .. t .. ', want a ' .. want end
  return nil
end

local function keys_typed(wanted)
  for i, want in pairs(wanted) do
    local bad = key_type(KEYS[i], want)
    if bad then return 'KEYS[' .. i .. ']: ' .. bad end
  end
  return nil
end

local function check()
  if #KEYS ~= 2 or #ARGV < 2 or #ARGV > 3 then
    return 'arguments: want 2 KEYS and 2 or 3 ARGV, got ' .. #KEYS .. ' and ' .. #ARGV
  end
  if #ARGV[1] < 1 or #ARGV[1] > 256 or string.find(ARGV[1], '[{}]') then
    return 'agent_id: want 1..256 bytes, no braces'
  end
  local m = ARGV[2]
  if #m > 8 or not string.find(m, '^[1-9]%d*$') or tonumber(m) < 1 or tonumber(m) > 10000000 then
    return 'events maxlen ' .. show(m) .. ': want an integer 1..10000000'
  end
  if ARGV[3] and #ARGV[3] > 256 then return 'instance_id: want 0..256 bytes' end
  return keys_typed({[1] = 'hash', [2] = 'stream'})
end

local err = check()
if err then return redis.error_reply('ERR reach: bad ' .. err) end

local s = redis.call('HMGET', KEYS[1], 'state', 'draining', 'instance_id', 'agent_id')
if not s[1] or s[1] == 'evicted' or s[4] ~= ARGV[1] then
  return 0
end
local instance = ARGV[3] or ''
if instance ~= '' and s[3] ~= instance then
  return -1
end
if s[2] == '1' then
  return 2
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'draining', '1', 'draining_ms', now)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*',
  'type', 'draining', 'agent_id', ARGV[1], 'instance_id', s[3] or '', 'ts', now)
return 1
