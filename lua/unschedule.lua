-- unschedule.lua: remove scheduled sends from the scheduled set and their envelopes, in
-- one step (a mover once it placed them, a cancel before they were due).
--
-- KEYS[1] the scheduled set (zset: msg_id -> due, epoch ms)
-- KEYS[2] the scheduled envelopes (hash: msg_id -> envelope bytes)
-- ARGV[1..n] msg_ids, 1..1024 bytes each, 1..1000 of them (unpack bounds a call)
--
-- Returns the number of msg_ids that were in the set.
-- Errors  'ERR reach: bad <argument>: <why>' when an argument or a key's type is out of
--         contract; nothing is written then.
--!include args
--!include key_types

local function check()
  if #KEYS ~= 2 or #ARGV < 1 or #ARGV > 1000 then
    return 'arguments: want 2 KEYS and 1..1000 ARGV, got ' .. #KEYS .. ' and ' .. #ARGV
  end
  for i = 1, #ARGV do
    local e = bytes_bad('msg_id', i, 1, 1024)
    if e then return e end
  end
  return keys_typed({'zset', 'hash'})
end

local err = check()
if err then return refuse(err) end

local n = redis.call('ZREM', KEYS[1], unpack(ARGV))
redis.call('HDEL', KEYS[2], unpack(ARGV))
return n
