-- register.lua: add an agent's registration, or replace an older one (version fence).
--
-- Every key is of the agent's registry shard, one hash slot (docs/protocol.md, "Registry
-- shards"): the agent's record, lease, capability-set entries, counts and event change
-- together.
--
-- KEYS[1] agents zset (agent_id -> next lease deadline, epoch ms)
-- KEYS[2] the agent's hash: must be KEYS[6] .. ARGV[1]
-- KEYS[3] caps zset (capability -> number of agents declaring it)
-- KEYS[4] registry events stream
-- KEYS[5] capability-set key prefix (capability names are appended; same slot)
-- KEYS[6] agent-hash key prefix (the sweeper finds the hash as prefix .. agent_id)
-- ARGV[1] agent_id: 1..256 bytes of UTF-8, not blank, no '{' or '}'
-- ARGV[2] instance_id (new every process start): 1..256 bytes of UTF-8
-- ARGV[3] version: start stamp in microseconds, integer 0..2^53-1; an older one than stored
--         is refused
-- ARGV[4] weight: decimal number, 0 < weight <= 1000
-- ARGV[5] capabilities, normalised, comma-joined: 1..1000 distinct names of 1..200 bytes
--         matching ^[a-z0-9_]+(\.[a-z0-9_]+)*$
-- ARGV[6] metadata: a JSON object, at most 65536 bytes of UTF-8, nested at most 64 deep;
--         numbers as JSON writes them (no nan, inf, hex, +1, 01)
-- ARGV[7] lease_ms: integer 1..86400000 (1 day)
-- ARGV[8] evict_after_ms: integer 1..86400000
-- ARGV[9] events stream max length (approximate): integer 1..10000000
-- ARGV[10] A2A agent card: '' or a JSON object as for metadata, at most 262144 bytes
-- ARGV[11] ready flag, '0' or '1'
-- ARGV[12] max queue depth the agent accepts (0 = unbounded): integer 0..1000000000
-- ARGV[13] (optional) slots: handlers the agent runs at once (its concurrency; 0 = not
--          reported), integer 0..1000000000; heartbeats report it again
-- ARGV[14] (optional, after slots) the protocol version the agent's runtime speaks
--          (docs/protocol.md, "Protocol version"): integer 1..1000000, stored as the field
--          'protocol'; without it (the 12- and 13-ARGV forms of older runtimes) the record
--          has none
-- ARGV[15], ARGV[16] (optional, both or neither, after slots and protocol) host: the
--         process's host name, 0..256 bytes of UTF-8; pid: its process id, integer
--         0..2^53-1. Stored as 'host' and 'pid', so the registration that replaces this one
--         can name it
-- ARGV[17] (optional, after host and pid) app_version: the application version the agent
--          runs (Agent(version=...), version canaries: docs/routing.md), 0..64 bytes of
--          [A-Za-z0-9._+-]; stored as 'app_version' when not empty (a record without it:
--          version "")
--
-- Every argument is checked before the first write: a refused call writes nothing.
-- Integers are plain decimal digits (no sign, leading zero, exponent, hex, inf or nan).
--
-- Returns {1, now_ms}: registered anew
--         {2, now_ms}: replaced a registration of the same agent_id (same or older version,
--                      or a stored record whose version is unreadable); the same
--                      instance registering over its evicted record keeps its 'draining'
--                      flag (an operator's drain outlives an eviction); any other
--                      registration starts not draining
--         {2, now_ms, instance_id, host, pid, live}: the same, when the registration
--                      replaced is another instance's (not a re-registration of this
--                      one): its instance_id, host and pid ('' if it stored none) and
--                      live '1' when its lease still ran (state active, lease deadline
--                      ahead: a process that may still be serving), else '0'. A
--                      'replaced' event names it (instance_id: the replaced one; detail:
--                      host, pid and the new instance), before the 'registered' event
--         {-1, stored_version}: refused, a newer registration exists (stale)
--         (the codes: RegisterCode of lua/includes/codes.lua)
-- Errors  'reach: bad <argument>: <why>' (an error reply; redis-py raises ResponseError)
--         when an argument, or the number of KEYS or ARGV, is out of contract, or a key
--         (KEYS[1..4], a capability set to join) holds another type than the one above.
--!include registry
--!include caps
--!include now
--!include codes

local function utf8_ok(v)
  if not string.find(v, '[\128-\255]') then return true end
  local i, n = 1, #v
  while i <= n do
    local c, len = string.byte(v, i), 0
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len = 2
    elseif c >= 0xE0 and c <= 0xEF then len = 3
    elseif c >= 0xF0 and c <= 0xF4 then len = 4
    else return false end
    for k = i + 1, i + len - 1 do
      local b = string.byte(v, k)
      if not b or b < 0x80 or b > 0xBF then return false end
    end
    local b = string.byte(v, i + 1)
    if (c == 0xE0 and b < 0xA0) or (c == 0xED and b > 0x9F)  -- overlong, surrogate
      or (c == 0xF0 and b < 0x90) or (c == 0xF4 and b > 0x8F) then return false end
    i = i + len
  end
  return true
end

local function json_number_ok(t)
  local s = string.gsub(t, '^%-', '', 1)
  local whole = string.match(s, '^%d+')
  if not whole or (#whole > 1 and string.sub(whole, 1, 1) == '0') then return false end
  s = string.sub(s, #whole + 1)
  if string.sub(s, 1, 1) == '.' then
    local frac = string.match(s, '^%.(%d+)')
    if not frac then return false end
    s = string.sub(s, #frac + 2)
  end
  return s == '' or string.find(s, '^[eE][+-]?%d+$') ~= nil
end

-- A JSON object that every reader parses the same way. cjson alone is laxer than JSON
-- (it takes nan, inf, hex, +1, 01, 1.): after it, every bare token must be a JSON number
-- or true/false/null, and nesting stays shallow enough for any recursive decoder.
local function json_object_ok(v, max)
  if #v > max or not string.find(v, '^%s*{') or not utf8_ok(v) then return false end
  local ok, t = pcall(cjson.decode, v)
  if not ok or type(t) ~= 'table' then return false end
  local bare = string.gsub(string.gsub(string.gsub(v, '\\\\', ''), '\\"', ''), '"[^"]*"', '""')
  if string.find(bare, '[^ \t\r\n%w%.%+%-{}%[%]:,"]') then return false end
  for tok in string.gmatch(bare, '[%w%.%+%-]+') do
    if tok ~= 'true' and tok ~= 'false' and tok ~= 'null' and not json_number_ok(tok) then
      return false
    end
  end
  local depth = 0
  for c in string.gmatch(bare, '[%[%]{}]') do
    if c == '{' or c == '[' then
      depth = depth + 1
      if depth > 64 then return false end
    else
      depth = depth - 1
    end
  end
  return true
end

local function id_ok(v)
  return #v >= 1 and #v <= 256 and string.find(v, '%S') ~= nil and not string.find(v, '[{}]')
    and utf8_ok(v)
end

local function cap_ok(c)
  return #c >= 1 and #c <= 200 and string.find(c, '^[a-z0-9_.]+$') ~= nil
    and not string.find(c, '^%.') and not string.find(c, '%.$') and not string.find(c, '%.%.')
end

local function split(s)
  local out, i = {}, 1
  while true do
    local j = string.find(s, ',', i, true)
    if not j then
      out[#out + 1] = string.sub(s, i)
      return out
    end
    out[#out + 1] = string.sub(s, i, j - 1)
    i = j + 1
  end
end

local function check()
  local e = arity(6, (#ARGV >= 12 and #ARGV <= 17 and #ARGV ~= 15) and #ARGV or 16)
  if e then return e end
  if #ARGV == 17 and (#ARGV[17] > 64 or string.find(ARGV[17], '[^A-Za-z0-9._+%-]')) then
    return 'app_version ' .. show(ARGV[17]) .. ': want 0..64 characters of A-Z a-z 0-9 . _ + -'
  end
  if #ARGV >= 16 then
    if #ARGV[15] > 256 or not utf8_ok(ARGV[15]) then return 'host: want 0..256 bytes of UTF-8' end
    if not int(ARGV[16], 0, 9007199254740991) then return 'pid ' .. show(ARGV[16]) .. ': want an integer 0..2^53-1' end
  end
  if not id_ok(ARGV[1]) then return 'agent_id: want 1..256 bytes of UTF-8, not blank, no braces' end
  if KEYS[2] ~= KEYS[6] .. ARGV[1] then return 'agent_id: KEYS[2] is not the hash of ' .. show(ARGV[1]) end
  if #ARGV[2] < 1 or #ARGV[2] > 256 or not utf8_ok(ARGV[2]) then
    return 'instance_id: want 1..256 bytes of UTF-8'
  end
  if not int(ARGV[3], 0, 9007199254740991) then return 'version ' .. show(ARGV[3]) .. ': want an integer 0..2^53-1' end
  local w = ARGV[4]
  local wn = #w <= 32 and string.find(w, '^[0-9.eE+%-]+$') and tonumber(w)
  if not wn or wn ~= wn or wn <= 0 or wn > 1000 then
    return 'weight ' .. show(w) .. ': want a number, 0 < weight <= 1000'
  end
  if #ARGV[5] > 201000 then return 'capabilities: too long' end
  local caps, seen = split(ARGV[5]), {}
  if #caps > 1000 then return 'capabilities: want 1..1000' end
  for _, cap in ipairs(caps) do
    if not cap_ok(cap) then return 'capability ' .. show(cap) .. ': want ^[a-z0-9_]+(\\.[a-z0-9_]+)*$, 1..200 bytes' end
    if seen[cap] then return 'capability ' .. show(cap) .. ': listed twice' end
    seen[cap] = true
    local bad = key_type(KEYS[5] .. cap, 'set')
    if bad then return 'capability set of ' .. show(cap) .. ': ' .. bad end
  end
  if not json_object_ok(ARGV[6], 65536) then
    return 'metadata: want a JSON object (UTF-8, nesting <= 64) of at most 65536 bytes'
  end
  if not int(ARGV[7], 1, DAY) then return 'lease_ms ' .. show(ARGV[7]) .. ': want an integer 1..86400000' end
  if not int(ARGV[8], 1, DAY) then return 'evict_after_ms ' .. show(ARGV[8]) .. ': want an integer 1..86400000' end
  e = maxlen_bad(ARGV[9])
  if e then return e end
  if ARGV[10] ~= '' and not json_object_ok(ARGV[10], 262144) then
    return 'card: want a JSON object (UTF-8, nesting <= 64) of at most 262144 bytes, or empty'
  end
  if ARGV[11] ~= '0' and ARGV[11] ~= '1' then return 'ready ' .. show(ARGV[11]) .. ": want '0' or '1'" end
  if not int(ARGV[12], 0, 1000000000) then return 'max_queue ' .. show(ARGV[12]) .. ': want an integer 0..1000000000' end
  if ARGV[13] and not int(ARGV[13], 0, 1000000000) then
    return 'slots ' .. show(ARGV[13]) .. ': want an integer 0..1000000000'
  end
  if ARGV[14] and not int(ARGV[14], 1, 1000000) then
    return 'protocol ' .. show(ARGV[14]) .. ': want an integer 1..1000000'
  end
  return keys_typed({[1] = 'zset', [2] = 'hash', [3] = 'zset', [4] = 'stream'})
end

local err = check()
if err then return refuse(err) end

local now = now_ms()
local id = ARGV[1]
local version = tonumber(ARGV[3])

local stored = redis.call('HMGET', KEYS[2], 'version', 'caps', 'state', 'instance_id', 'host',
  'pid', 'draining')
local code = RegisterCode_NEW
local replaced = nil
local draining = '0'
if redis.call('EXISTS', KEYS[2]) == 1 then
  -- A stored version that is not a number (a record written behind the scripts' back)
  -- cannot fence anyone: the new registration replaces it.
  local sv = tonumber(stored[1])
  if sv and sv == sv and sv > version then
    return {RegisterCode_STALE, stored[1]}
  end
  code = RegisterCode_REPLACED
  -- The same process registering again after an eviction it outlived keeps a drain an
  -- operator asked of it: it may have been evicted before a heartbeat told it. (A live
  -- record registered again is one the agent found unreadable: it starts afresh.)
  if stored[4] == ARGV[2] and stored[3] == 'evicted' and stored[7] == '1' then
    draining = '1'
  end
  if stored[4] and stored[4] ~= ARGV[2] then
    local deadline = tonumber(redis.call('ZSCORE', KEYS[1], id)) or 0
    local live = (stored[3] == 'active' and deadline > now) and '1' or '0'
    replaced = {stored[4], stored[5] or '', stored[6] or '', live}
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[9], '*', 'type', 'replaced',
      'agent_id', id, 'instance_id', stored[4], 'ts', now,
      'detail', 'host=' .. replaced[2] .. ' pid=' .. replaced[3] .. ' live=' .. live
        .. ' by=' .. ARGV[2])
  end
  leave_caps(stored[2], id, KEYS[5], KEYS[3])
  redis.call('DEL', KEYS[2])
end

for cap in string.gmatch(ARGV[5], '[^,]+') do
  local set = KEYS[5] .. cap
  redis.call('SADD', set, id)
  redis.call('ZADD', KEYS[3], redis.call('SCARD', set), cap)
end

redis.call('HSET', KEYS[2],
  'agent_id', id, 'instance_id', ARGV[2], 'version', ARGV[3], 'weight', ARGV[4],
  'caps', ARGV[5], 'metadata', ARGV[6], 'lease_ms', ARGV[7], 'evict_after_ms', ARGV[8],
  'card', ARGV[10], 'ready', ARGV[11], 'draining', draining, 'state', 'active',
  'registered_ms', now, 'last_heartbeat_ms', now, 'state_ms', now,
  'ready_ms', (ARGV[11] == '1') and now or 0, 'queue_depth', 0, 'inflight', 0,
  'max_queue', ARGV[12], 'slots', ARGV[13] or '0', 'handler_us', 0)
if ARGV[14] then redis.call('HSET', KEYS[2], 'protocol', ARGV[14]) end
if #ARGV >= 16 then redis.call('HSET', KEYS[2], 'host', ARGV[15], 'pid', ARGV[16]) end
if #ARGV == 17 and ARGV[17] ~= '' then redis.call('HSET', KEYS[2], 'app_version', ARGV[17]) end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[7]), id)
event(KEYS[4], ARGV[9], 'registered', id, ARGV[2], now)
if replaced then
  return {code, now, replaced[1], replaced[2], replaced[3], replaced[4]}
end
return {code, now}
