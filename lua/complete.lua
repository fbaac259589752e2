-- complete.lua: settle claimed idempotency keys, each only if the caller still holds its
-- claim (fence token). Standalone Redis gets a batch in one call; a Cluster one key a call.
--
-- KEYS[1..n] idempotency records (hashes, or absent)
-- ARGV[1] ttl_ms: how long a record lives from now, integer 1..31536000000 (365 days)
-- for KEYS[i], j = 1 + 5 * (i - 1):
--   ARGV[j+1] fence token returned by claim.lua: integer 1..2^53
--   ARGV[j+2] task status: succeeded | failed | retrying | expired | dead
--   ARGV[j+3] stored reply bytes (the record's short form of the reply, docs/protocol.md:
--             what later deliveries replay), or ''; stored only with mode 'done'
--   ARGV[j+4] mode: 'done' (final: later deliveries replay the stored reply) or
--             'release' (the key may be claimed and run again: retry, dead-letter replay)
--   ARGV[j+5] error text for the status ('' = none)
-- So #ARGV = 1 + 5 * #KEYS. Integers are plain decimal digits without sign or leading zero.
--
-- A watched record settled announces its new status (lua/includes/announce.lua); a
-- fenced one announces nothing.
--
-- Every argument, and the type of every key, is checked before the first write: a refused
-- call writes nothing.
--
-- Returns one code per key, in order:
--   1: settled
--   0: fenced: another owner claimed the key since (this worker's claim ran out); nothing
--      was written and the caller must not reply or ack
--         (the codes: SettleCode of lua/includes/codes.lua)
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError) when the number of ARGV, an argument, or a key's type is out of
--         contract. Only a bug or a hostile caller gets one: the runtime never sends such
--         a call.
--!include fence
--!include record
local MAX_TTL = 31536000000

local function of_key(i)
  return ' of KEYS[' .. i .. ']'
end

local function check()
  local e = batch_arity(1, 5) or int_bad('ttl_ms', 1, 1, MAX_TTL)
  if e then return e end
  for i = 1, #KEYS do
    e = completion_bad(2 + 5 * (i - 1), of_key, i)
      or read_record(i, 'fence', 'done', 'runs', 'steps', 'watched')
    if e then return e end
  end
end

return batch(check, function(i, key, now)
  local rec = record(i, 'fence', 'done', 'runs', 'steps', 'watched')
  local f = 2 + 5 * (i - 1)
  return complete_record(key, rec, ARGV[f], ARGV[f + 1], ARGV[f + 2], ARGV[f + 3], ARGV[f + 4],
    ARGV[1], now)
end)
