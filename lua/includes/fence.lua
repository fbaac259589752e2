-- fence.lua: completing a claimed idempotency record, only while the caller still holds
-- its claim (the fence token claim.lua gave it). complete.lua and settle.lua describe a
-- completion by five ARGV from index f on: fence, status, stored reply bytes, mode, error
-- text.
--!include args
--!include codes
--!include announce
local MAX_FENCE = 9007199254740992

-- Why the completion at ARGV[f..f+4] is refused, or nil. where(n) names its item in the
-- message (' of KEYS[2]'); called only on refusal.
local function completion_bad(f, where, n)
  if not int_memo(ARGV[f], 1, MAX_FENCE) then
    return bad('fence' .. where(n), f, 'want an integer 1..2^53')
  end
  -- Compared, not looked up in a table of the words: the script builds its tables anew at
  -- every call, and a table costs more than these comparisons.
  local s = ARGV[f + 1]
  if s ~= 'succeeded' and s ~= 'failed' and s ~= 'retrying' and s ~= 'expired' and s ~= 'dead' then
    return bad('status' .. where(n), f + 1, 'want succeeded, failed, retrying, expired or dead')
  end
  local m = ARGV[f + 3]
  if m ~= 'done' and m ~= 'release' then
    return bad('mode' .. where(n), f + 3, "want 'done' or 'release'")
  end
  return nil
end

-- Store a completion in record `key` (fence, status, stored reply, mode and error text:
-- the five values ARGV[f..f+4] carry), whose fence, done, runs, steps and
-- watched fields are rec (HMGET key fence done runs steps watched), if the fence still
-- matches and it is not done yet: its status and error; for mode 'done' also done = 1 and the reply later
-- deliveries replay (the bytes as given: the runtime sends the short form of
-- docs/protocol.md), and the step journal (step.lua: 'steps' and each 's:<name>') is
-- deleted, since a done key is replayed and never run again (a 'release' keeps it for the
-- next run). A record claimed at send whose run was not counted yet (no runs, or runs 0
-- as an older send.lua wrote it: a quick handler gets no start.lua) counts it now. Fields left with nothing to say are deleted,
-- not written empty: owner and lease_until (the claim is over) and an empty error; every
-- reader takes an absent one as '' (lease_until: 0). Fewer fields, none of them long, keep
-- a small record in Redis's compact hash encoding (docs/operations.md, *Memory per
-- completed record*). The record then lives ttl ms; a watched one announces its new status
-- (lua/includes/announce.lua). now: the server time (ms), best as its decimal string (a
-- Lua number costs Redis a conversion per use). Returns SettleCode_SETTLED, or FENCED
-- (nothing written): another owner claimed the key since.
local function complete_record(key, rec, fence, status, stored, mode, err, ttl, now)
  if not rec[1] or rec[1] ~= fence or rec[2] == '1' then return SettleCode_FENCED end
  if mode == 'done' and err == '' and not rec[4] then
    -- The common outcome (a reply stored, no error, no journal) written out as the general
    -- form below would write it: a table and its unpack cost more than the HSET itself.
    -- HSET before HDEL, though the other order counts fewer instructions: the first write
    -- of a script decides whether a full Redis (maxmemory) refuses it, and only HSET is a
    -- command a full Redis refuses. A first HDEL would pass, and every write after it
    -- with it (Redis does not stop a script that has written): a worker would settle
    -- and ack while Redis is full (tests/integration/test_full_redis.py).
    if not rec[3] or rec[3] == '0' then
      redis.call('HSET', key, 'status', status, 'updated_ms', now, 'done', '1',
        'reply', stored, 'runs', '1')
    else
      redis.call('HSET', key, 'status', status, 'updated_ms', now, 'done', '1',
        'reply', stored)
    end
    redis.call('HDEL', key, 'owner', 'lease_until', 'error')
  else
    local w = {'HSET', key, 'status', status, 'updated_ms', now}
    local gone = {'HDEL', key, 'owner', 'lease_until'}
    if err ~= '' then
      w[#w + 1], w[#w + 2] = 'error', err
    else
      gone[#gone + 1] = 'error'
    end
    if mode == 'done' then
      w[#w + 1], w[#w + 2], w[#w + 3], w[#w + 4] = 'done', '1', 'reply', stored
      if rec[4] then  -- only a record with a journal pays for listing its fields
        gone[#gone + 1] = 'steps'
        for _, name in ipairs(redis.call('HKEYS', key)) do
          if string.sub(name, 1, 2) == 's:' then gone[#gone + 1] = name end
        end
      end
    end
    if not rec[3] or rec[3] == '0' then w[#w + 1], w[#w + 2] = 'runs', '1' end
    redis.call(unpack(w))
    redis.call(unpack(gone))
  end
  redis.call('PEXPIRE', key, ttl)
  if rec[5] then announce(key, status) end
  return SettleCode_SETTLED
end
