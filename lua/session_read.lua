-- session_read.lua: one session's values or history together with its version, read in one
-- step, so an agent caching it (the 'cached' tier, reach/_sessions/cache.py) knows which
-- write its copy follows.
--
-- KEYS[1] the session's values (a hash, or absent)
-- KEYS[2] the session's history (a list, or absent)
-- KEYS[3] the session's version (a string holding a counter, or absent)
-- ARGV[1] what to read: 'values' or 'history'
--
-- Returns {version, data}: version is the counter session_write.lua raised last ('0' when
-- the session has none); data is HGETALL of KEYS[1] (field, value, ...) for 'values', the
-- whole list KEYS[2] (oldest first) for 'history'.
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of KEYS or ARGV or an argument is out of contract,
--         or a key holds another type.
--!include args
--!include key_types

local function check()
  local why = arity(3, 1)
  if why then return why end
  if ARGV[1] ~= 'values' and ARGV[1] ~= 'history' then
    return bad('what', 1, "want 'values' or 'history'")
  end
  return keys_typed({'hash', 'list', 'string'})
end

local err = check()
if err then return refuse(err) end

local version = redis.call('GET', KEYS[3]) or '0'
if ARGV[1] == 'values' then return {version, redis.call('HGETALL', KEYS[1])} end
return {version, redis.call('LRANGE', KEYS[2], 0, -1)}
