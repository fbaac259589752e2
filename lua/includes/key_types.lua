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
