-- key_types.lua: a key of another type than a script writes (written behind the scripts'
-- back) would fail a command half-way through its writes: scripts refuse it before the
-- first one.

-- 'holds a <type>, want a <want>' when key exists with another type than want, else nil.
local function key_type(key, want)
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= want then return 'holds a ' .. t .. ', want a ' .. want end
  return nil
end

-- wanted: {[i] = type}; why KEYS[i] of the first misfit is refused, or nil.
local function keys_typed(wanted)
  for i, want in pairs(wanted) do
    local why = key_type(KEYS[i], want)
    if why then return 'KEYS[' .. i .. ']: ' .. why end
  end
  return nil
end

-- The reply of `cmd` KEYS[i], a read that fails on nothing but a key of another type than
-- want (XLEN on a stream, HLEN on a hash: an integer, 0 for an absent key), or nil and why
-- KEYS[i] is refused, as key_type words it. One command where TYPE and then the read would
-- be two, and an integer reply costs Lua less than TYPE's status table.
local function read_typed(cmd, i, want)
  local v = redis.pcall(cmd, KEYS[i])
  if type(v) == 'number' then return v end
  return nil, 'KEYS[' .. i .. ']: holds a ' .. redis.call('TYPE', KEYS[i])['ok'] .. ', want a '
    .. want
end
