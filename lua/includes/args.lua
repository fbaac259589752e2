-- args.lua: checking ARGV before the first write. A script that finds an argument out of
-- contract answers refuse(why), the error reply 'ERR reach: bad <argument>: <why>'
-- (redis-py raises ResponseError('reach: bad ...')), and writes nothing.

-- A value as a refusal shows it: at most 40 bytes, anything but [%w.+-_ ] as '?'.
local function show(v)
  return (string.gsub(string.sub(tostring(v), 1, 40), '[^%w%.%+%-_ ]', '?'))
end

-- A plain decimal integer ('0' or digits without a leading zero: Redis itself refuses '007'
-- as a MAXLEN or PX; no sign, space, exponent, hex, inf or nan) in lo..hi; nil for anything
-- else.
local function int(v, lo, hi)
  if type(v) ~= 'string' or #v > 16 or not (v == '0' or string.find(v, '^[1-9]%d*$')) then
    return nil
  end
  local n = tonumber(v)
  if n < lo or n > hi then return nil end
  return n
end

-- int() for the numbers a batch repeats (indexes, counts, leases, fences): each distinct
-- string is parsed once (a parse costs more than the lookup, a first sight more than both).
local parsed = {}
local function int_memo(v, lo, hi)
  local n = parsed[v]
  if n == nil then
    n = int(v, -math.huge, math.huge) or false
    parsed[v] = n
  end
  if not n or n < lo or n > hi then return nil end
  return n
end

-- Why a call without n_keys KEYS and n_argv ARGV is refused, or nil.
local function arity(n_keys, n_argv)
  if #KEYS == n_keys and #ARGV == n_argv then return nil end
  return 'arguments: want ' .. n_keys .. ' KEYS and ' .. n_argv .. ' ARGV, got ' .. #KEYS
    .. ' and ' .. #ARGV
end

-- '<what> (ARGV[p]) <value>: <want>', the refusal of ARGV[p].
local function bad(what, p, want)
  return what .. ' (ARGV[' .. p .. ']) ' .. show(ARGV[p]) .. ': ' .. want
end

-- Why ARGV[p], <what>, is refused as an integer lo..hi, or nil.
local function int_bad(what, p, lo, hi)
  if int(ARGV[p], lo, hi) then return nil end
  return bad(what, p, 'want an integer ' .. lo .. '..' .. hi)
end

-- Why ARGV[p], <what>, is refused as a string of lo..hi bytes, or nil.
local function bytes_bad(what, p, lo, hi)
  local n = #ARGV[p]
  if n >= lo and n <= hi then return nil end
  return what .. ' (ARGV[' .. p .. ']): want ' .. lo .. '..' .. hi .. ' bytes'
end

local function refuse(why)
  return redis.error_reply('ERR reach: bad ' .. why)
end
