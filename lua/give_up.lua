-- give_up.lua: record that no handler will run a message (its deadline passed while it
-- waited, or no router will ever take it) in its idempotency record, unless its key
-- completed meanwhile. The check and the write are one step: a worker that completes the
-- key between them cannot have its 'succeeded' overwritten. The sweeper calls it before
-- it files the dead letter and tells the caller (other slots, so other commands).
--
-- KEYS[1] the message's idempotency record (a hash, or absent)
-- ARGV[1] status: expired | dead
-- ARGV[2] error text for the status ('' = none)
-- ARGV[3] ttl_ms: how long the record lives from now, integer 1..31536000000 (365 days)
-- Integers are plain decimal digits without sign or leading zero.
--
-- A status written in a watched record is announced (lua/includes/announce.lua).
--
-- Every argument, and the type of KEYS[1], is checked before the first write: a refused
-- call writes nothing.
--
-- Returns nil: given up: status, error and updated_ms (server time) written, the record
--              lives ttl_ms
--         {reply, status, agent_id, msg_id}: the key had completed (done = 1): its stored
--              reply ('' when none) and the record's fields it is rebuilt from ('' each
--              when absent), as claim.lua's replay answer; nothing was written, and the
--              caller gets that reply
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of KEYS or ARGV, an argument, or the key's type is
--         out of contract.
--!include args
--!include record
--!include now
--!include announce
local MAX_TTL = 31536000000
local GIVEN_UP = {expired = true, dead = true}

local function check()
  local why = arity(1, 3)
  if why then return why end
  if not GIVEN_UP[ARGV[1]] then return bad('status', 1, 'want expired or dead') end
  if not int(ARGV[3], 1, MAX_TTL) then return bad('ttl_ms', 3, 'want an integer 1..' .. MAX_TTL) end
  return read_record(1, 'done', 'reply', 'agent_id', 'msg_id', 'status', 'watched')
end

local err = check()
if err then return refuse(err) end

local s = record(1, 'done', 'reply', 'agent_id', 'msg_id', 'status', 'watched')
if s[1] == '1' then return {s[2] or '', s[5] or '', s[3] or '', s[4] or ''} end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'error', ARGV[2], 'updated_ms', now_ms())
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if s[6] then announce(KEYS[1], ARGV[1]) end
return false
