-- pin_version.lua: the application version a session's messages of a split capability go
-- to (version canaries, docs/routing.md). The first message of a session pins the version
-- its sender chose; every later one, from any process, gets that pin for as long as the
-- pinned version keeps a share above 0 in the capability's split. A pinned version whose
-- share went to 0 is replaced by the version the caller chose now. Each call renews the
-- pins' TTL, so a session idle longer than the TTL starts afresh.
--
-- KEYS[1] the session's version pins (a hash: capability -> version)
-- ARGV[1] capability: 1..200 bytes
-- ARGV[2] the version this caller chose for a new session: 0..64 bytes ('' = the agents
--         that state no version)
-- ARGV[3] ttl_ms: integer 1..2592000000 (30 days)
-- ARGV[4..] the versions that have a share above 0 in the split now (at least one; ARGV[2]
--         is one of them), each 0..64 bytes
--
-- Returns the version the session's message goes to: the pinned one when it is among
--         ARGV[4..], else ARGV[2] (then pinned)
-- Errors  'ERR reach: bad <argument>: <why>' when an argument or the key's type is out of
--         contract; nothing is written then.
local MAX_TTL = 2592000000

--!include args
--!include key_types

local function version_ok(v)
  return #v <= 64 and not string.find(v, '[^A-Za-z0-9._+%-]')
end

local function check()
  if #KEYS ~= 1 or #ARGV < 4 then
    return 'arguments: want 1 KEYS and at least 4 ARGV, got ' .. #KEYS .. ' and ' .. #ARGV
  end
  if #ARGV[1] < 1 or #ARGV[1] > 200 then return 'capability: want 1..200 bytes' end
  if not version_ok(ARGV[2]) then return bad('version', 2, 'want 0..64 of A-Z a-z 0-9 . _ + -') end
  local e = int_bad('ttl_ms', 3, 1, MAX_TTL)
  if e then return e end
  local chosen_live = false
  for i = 4, #ARGV do
    if not version_ok(ARGV[i]) then return bad('version', i, 'want 0..64 of A-Z a-z 0-9 . _ + -') end
    if ARGV[i] == ARGV[2] then chosen_live = true end
  end
  if not chosen_live then return bad('version', 2, 'not among the versions with a share') end
  return keys_typed({'hash'})
end

local err = check()
if err then return refuse(err) end

local pinned = redis.call('HGET', KEYS[1], ARGV[1])
local out = ARGV[2]
if pinned then
  for i = 4, #ARGV do
    if ARGV[i] == pinned then
      out = pinned
      break
    end
  end
end
if out ~= pinned then redis.call('HSET', KEYS[1], ARGV[1], out) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return out
