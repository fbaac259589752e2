-- session_write.lua: a batch of writes to one session's store (ctx.session), applied in one
-- step: its keys' TTL renewed, its version raised, and the change announced to the agents
-- that cache sessions (the 'cached' tier, reach/_sessions/cache.py), so none of them serves
-- the session as it was before.
--
-- KEYS[1] the session's values (a hash, or absent)
-- KEYS[2] the session's history (a list, or absent)
-- KEYS[3] the session's version (a string holding a counter, or absent)
-- ARGV[1] ttl_ms: the TTL all three keys get, integer 1..2^53
-- ARGV[2] channel: the namespace's session-change channel (PUBLISH; '' = announce nothing)
-- ARGV[3] session id, as the announcement carries it: 1..512 bytes
-- ARGV[4..] the writes, in order, each an op code followed by its arguments:
--   'S' field value    HSET field value
--   'D' field          HDEL field
--   'A' item max_len   RPUSH item, then LTRIM to the last max_len items (max_len 0 = all)
--   'C'                DEL values and history
-- Integers are plain decimal digits without sign or leading zero.
--
-- The announcement, on ARGV[2]: '<version>:<session id>', the version this batch made.
--
-- Every argument, and the types of the keys, is checked before the first write: a refused
-- call writes nothing.
--
-- Returns {version, history length}: the session's version after this batch (1 for a
-- session without one) and its history's length after it.
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of KEYS or ARGV, an argument, an op, or a key's
--         type is out of contract.
--!include args
--!include key_types
local MAX_TTL, MAX_ID, MAX_LEN = 9007199254740992, 512, 4294967295
local WIDTH = {S = 3, D = 2, A = 3, C = 1}

local function check()
  if #KEYS ~= 3 or #ARGV < 3 then
    return 'arguments: want 3 KEYS and at least 3 ARGV, got ' .. #KEYS .. ' and ' .. #ARGV
  end
  local why = int_bad('ttl_ms', 1, 1, MAX_TTL) or bytes_bad('session id', 3, 1, MAX_ID)
  if why then return why end
  local p = 4
  while p <= #ARGV do
    local w = WIDTH[ARGV[p]]
    if not w then return bad('op', p, "want 'S', 'D', 'A' or 'C'") end
    if p + w - 1 > #ARGV then return bad('op', p, 'its arguments are missing') end
    if ARGV[p] == 'A' then
      why = int_bad('max_len', p + 2, 0, MAX_LEN)
      if why then return why end
    end
    p = p + w
  end
  return keys_typed({'hash', 'list', 'string'})
end

local err = check()
if err then return refuse(err) end

local p = 4
while p <= #ARGV do
  local o = ARGV[p]
  if o == 'S' then
    redis.call('HSET', KEYS[1], ARGV[p + 1], ARGV[p + 2])
  elseif o == 'D' then
    redis.call('HDEL', KEYS[1], ARGV[p + 1])
  elseif o == 'A' then
    redis.call('RPUSH', KEYS[2], ARGV[p + 1])
    if ARGV[p + 2] ~= '0' then redis.call('LTRIM', KEYS[2], -tonumber(ARGV[p + 2]), -1) end
  else
    redis.call('DEL', KEYS[1], KEYS[2])
  end
  p = p + WIDTH[o]
end
local version = redis.call('INCR', KEYS[3])
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ARGV[1]) end
if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], version .. ':' .. ARGV[3]) end
return {version, redis.call('LLEN', KEYS[2])}
