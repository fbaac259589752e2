-- send.lua: add a message to an agent's inbox and mark it pending, in one step, unless
-- the agent's inbox is at its bound (standalone Redis; on a Cluster the client runs
-- enqueue.lua on the inbox's slot, then writes the pending record). The batch form adds
-- several messages to one agent's inboxes in one call.
--
-- KEYS[1] the inbox stream of the chosen agent and priority
-- KEYS[2] the message's idempotency record (hash; also its task status)
-- KEYS[3] the msg_id -> idempotency key pointer (written only when ARGV[5] ~= '')
-- KEYS[4..6] the agent's three inbox streams (high, normal, low; KEYS[1] is one of them):
--            given when ARGV[7] > 0 or in the batch form, left out otherwise
-- ARGV[1] envelope bytes (msgpack)
-- ARGV[2] capability
-- ARGV[3] attempt, integer 0..999999999999999
-- ARGV[4] msg_id
-- ARGV[5] the record's key when the caller chose an idempotency key (what KEYS[3] then
--         holds: reach.envelope.scoped_key), or '' (the record is named by the msg_id)
-- ARGV[6] ttl_ms of the record and the pointer, integer 1..31536000000 (365 days)
-- ARGV[7] max_queue: the agent's bound on queued + in-flight messages, integer
--         0..999999999999999; 0 (or absent) = unbounded
-- ARGV[8] claim for (optional, with ARGV[7] and ARGV[9]): the owner
--         "<agent_id>/<instance_id>" of the runtime the message (the batch form: every
--         message) is routed to, 3..1024 bytes, or '' (no claim)
-- ARGV[9] claim lease_ms, integer 1..604800000 (7 days): how long that claim holds
-- Integers are plain decimal digits without sign or leading zero.
--
-- Claiming at send (ARGV[8] ~= ''): when the message's record does not exist yet (the
-- first send of its key), the record is written claimed as claim.lua would claim it for
-- that owner (status stays 'pending', fence 1, owner, lease_until = now + lease_ms,
-- msg_id (only for a record named by a caller's key: one named by the msg_id has none,
-- its readers take the name's), agent_id, and no sent_msg_id: it would equal msg_id; no
-- updated_ms either, as a send without a claim writes none: the status has not changed
-- since the send, and the record's first update (start.lua, the completion, claim.lua)
-- writes it; no runs either: absent reads as 0, and the run is counted when it happens,
-- by start.lua or the completion, or by claim.lua's +1 if another owner takes the key
-- over) and the
-- inbox entry gets two more fields, 'c' the owner and 'l' lease_until (server ms), after
-- 'e'. The runtime named, reading the
-- entry as new with enough lease left, runs the handler without a claim round trip and
-- then confirms the claim (start.lua: status running, its own lease); any other reader
-- takes the claim.lua path, where this claim counts as any other. An existing record
-- (a resend of the key) is never claimed here and its entry has no 'c'.
--
-- The batch form (more than 9 ARGV): messages 2..n to the same agent follow, message j
-- (j >= 2) as KEYS[3j+1..3j+3] (its inbox, record and pointer, as KEYS[1..3]: its inbox
-- one of KEYS[4..6]) and ARGV[5j-2..5j+2] (as ARGV[1..5]; with a claim, ARGV[8..9], they
-- come 2 later: ARGV[5j..5j+4]); KEYS[4..6] and ARGV[7] are always given: 3n+3 KEYS and
-- 5n+2 ARGV (5n+4 with a claim) for n messages. The messages are added in order, each as
-- the one-message form would add it (each fresh record claimed, with the claim).
--
-- The compact form (ARGV[1] is '=', which no envelope is): n >= 1 messages to one agent
-- that share one inbox, capability and attempt and have no caller's key (each record is
-- named by its msg_id: no pointer), in 3 + n KEYS and 8 + 2n ARGV:
--   KEYS[1..3] the agent's three inbox streams (high, normal, low)
--   KEYS[3 + j] message j's idempotency record
--   ARGV[1] '=', ARGV[2] the inbox of them all: 1, 2 or 3 (KEYS[1..3]), ARGV[3]
--   capability, ARGV[4] attempt, ARGV[5] ttl_ms, ARGV[6] max_queue (as ARGV[7] above),
--   ARGV[7] claim for or '' (as ARGV[8] above), ARGV[8] claim lease_ms (read with a
--   claim, as ARGV[9] above), then ARGV[7 + 2j] message j's envelope bytes and
--   ARGV[8 + 2j] its msg_id.
-- Each message is added as the batch form would add it (what that form gives per message
-- is here given once), and the reply is the batch form's: one entry id or depth per
-- message. Five values a message fewer for Redis to read and the script to take.
--
-- The batch form looks at its records with one EXISTS first: when none exists (fresh
-- msg_ids, the usual batch) each is written as new without a look of its own; when any
-- does, each record is looked at alone (HLEN: its type, and whether it is there). With a
-- claim, a fresh record named by its msg_id whose capability and attempt are those of the
-- last such record this call wrote is a COPY of that one (the same fields and TTL; see
-- tpl below); a user whose ACL refuses COPY gets the HSET instead.
--
-- The bound counts the entries of the three inbox streams (XLEN: the runtime deletes an
-- entry once it is settled, so this is queued + being handled), at the moment of the add:
-- concurrent senders can never push an inbox past it.
--
-- A watched record made 'pending' again (a resend under a released key) announces it
-- (lua/includes/announce.lua).
--
-- Returns the inbox entry id (a string), or, when the inbox holds max_queue entries or
-- more, that number of entries (an integer) and nothing is written. The batch form returns
-- an array of those, one per message in order (the messages past the bound are refused,
-- each with the depth it met).
-- Errors  'ERR reach: bad <argument>: <why>' when an argument or a key's type is out of
--         contract (a pointer key only when written: ARGV[5] ~= ''); nothing is written
--         then (in the batch form: for no message).
local MAX_TTL, MAX_INT, MAX_LEASE = 31536000000, 999999999999999, 604800000

--!include args
--!include key_types
--!include now
--!include announce

-- The batch form: the ARGV of the claim (0, or 2 with ARGV[8..9]) before message 2's.
-- Message j's KEYS start after index 0 (j = 1) or 3j, its ARGV after 0 or 5j - 3 + fixed.
local fixed = 0

local fresh = {}  -- message j's record does not exist yet (the one-message form: j = 1)
local depth = 0  -- with a max_queue: the entries of the three inboxes, read by check()
local claim_for = ''  -- ARGV[8] when given: fresh records are claimed for it
local claim_agent  -- its agent id (the part before the last '/'), found by claim_bad

local lease_at = 9  -- the ARGV index of the claim's lease_ms (the compact form: 8)

-- Why the claim in ARGV[c..c+1] (ARGV[8..9]; the compact form's ARGV[7..8]) is refused,
-- or nil.
local function claim_bad(c)
  local e = bytes_bad('claim for', c, 3, 1024) or int_bad('claim lease_ms', c + 1, 1, MAX_LEASE)
  if e then return e end
  -- One match both checks the form and finds the agent id the claimed records name.
  claim_agent = string.match(ARGV[c], '^(.+)/[^/]+$')
  if not claim_agent then
    return bad('claim for', c, "want '<agent_id>/<instance_id>'")
  end
  lease_at = c + 1
  return nil
end

-- Why message j's record KEYS[i] is refused (not a hash), or nil; notes whether it exists
-- (HLEN: 0 for an absent key, and an error for one of another type, in one command).
local function record_bad(i, j)
  local len, why = read_typed('HLEN', i, 'hash')
  if why then return why end
  fresh[j] = len == 0
  return nil
end

-- Whether none of the batch's n records exists (one EXISTS per 500 of them; a key
-- named twice counts twice, which changes nothing about 0).
local function records_absent(n, compact)
  local recs = {}
  if compact then
    for j = 1, n do recs[j] = KEYS[3 + j] end
  else
    for j = 1, n do recs[j] = KEYS[(j == 1) and 2 or (3 * j + 2)] end
  end
  for first = 1, n, 500 do
    if redis.call('EXISTS', unpack(recs, first, math.min(n, first + 499))) > 0 then
      return false
    end
  end
  return true
end

-- Why one of the inboxes KEYS[first..first+2] (KEYS[4..6]; the compact form's KEYS[1..3])
-- is refused, or nil; their entries are counted in depth, what a max_queue is held
-- against (XLEN is their type check anyway).
local function inboxes_bad(first)
  for i = first, first + 2 do
    local len, why = read_typed('XLEN', i, 'stream')
    if why then return why end
    depth = depth + len
  end
  return nil
end

-- The compact form (ARGV[1] '='): see the header. Returns as check() does.
local function compact_bad()
  local n = (#ARGV - 8) / 2
  if n < 1 or n % 1 ~= 0 then
    return 'arguments: the compact form wants 8 ARGV and 2 per message, got ' .. #ARGV
  end
  if #KEYS ~= 3 + n then
    return 'keys: want ' .. (3 + n) .. ' KEYS for ' .. n .. ' messages, got ' .. #KEYS
  end
  local p = ARGV[2]
  if p ~= '1' and p ~= '2' and p ~= '3' then
    return bad('inbox index', 2, 'want 1, 2 or 3')
  end
  local e = int_bad('attempt', 4, 0, MAX_INT) or int_bad('ttl_ms', 5, 1, MAX_TTL)
    or int_bad('max_queue', 6, 0, MAX_INT)
  if e then return e end
  if ARGV[7] ~= '' then
    e = claim_bad(7)
    if e then return e end
    claim_for = ARGV[7]
  end
  e = inboxes_bad(1)
  if e then return e end
  if records_absent(n, true) then
    for j = 1, n do fresh[j] = true end
  else
    for j = 1, n do
      e = record_bad(3 + j, j)
      if e then return e end
    end
  end
  return nil, tonumber(ARGV[6]), n
end

local function check()
  if ARGV[1] == '=' then return compact_bad() end
  if #ARGV > 9 then
    if (#ARGV - 9) % 5 == 0 then
      fixed = 2
    elseif (#ARGV - 7) % 5 ~= 0 then
      return 'arguments: want 6, 7 or 9 ARGV, or 7 (or 9) and 5 per further message, got '
        .. #ARGV
    end
    local n = 1 + (#ARGV - 7 - fixed) / 5
    if #KEYS ~= 3 * n + 3 then
      return 'keys: want ' .. (3 * n + 3) .. ' KEYS for ' .. n .. ' messages, got ' .. #KEYS
    end
    local e = int_bad('ttl_ms', 6, 1, MAX_TTL) or int_bad('max_queue', 7, 0, MAX_INT)
    if e then return e end
    if fixed == 2 and ARGV[8] ~= '' then
      e = claim_bad(8)
      if e then return e end
      claim_for = ARGV[8]
    end
    -- Attempts repeat (mostly '0'): int_memo parses each distinct one once.
    local a = 0
    for j = 1, n do
      if not int_memo(ARGV[a + 3], 0, MAX_INT) then
        return bad('attempt', a + 3, 'want an integer 0..' .. MAX_INT)
      end
      a = 5 * j + 2 + fixed
    end
    e = inboxes_bad(4)
    if e then return e end
    -- Most batches are all fresh messages (new msg_ids): one EXISTS over their records
    -- answers 0, and none needs a look of its own. Any record there (a resend, a
    -- caller's key seen before) and each is looked at as below (its type and whether it
    -- exists).
    local all_fresh = records_absent(n)
    local in1, in2, in3 = KEYS[4], KEYS[5], KEYS[6]
    local k
    a = 0
    for j = 1, n do
      k = (j == 1) and 0 or 3 * j
      local inbox = KEYS[k + 1]
      if inbox ~= in1 and inbox ~= in2 and inbox ~= in3 then
        return 'KEYS[' .. (k + 1) .. ']: not one of the inboxes KEYS[4..6]'
      end
      if all_fresh then
        fresh[j] = true
      else
        e = record_bad(k + 2, j)
        if e then return e end
      end
      if ARGV[a + 5] ~= '' then  -- the pointer is written only with a caller's key
        local why = key_type(KEYS[k + 3], 'string')
        if why then return 'KEYS[' .. (k + 3) .. ']: ' .. why end
      end
      a = 5 * j + 2 + fixed
    end
    return nil, tonumber(ARGV[7]), n
  end
  if #ARGV < 6 or #ARGV == 8 then return 'arguments: want 6, 7 or 9 ARGV, got ' .. #ARGV end
  local e = int_bad('attempt', 3, 0, MAX_INT) or int_bad('ttl_ms', 6, 1, MAX_TTL)
    or (ARGV[7] and int_bad('max_queue', 7, 0, MAX_INT))
  if e then return e end
  if #ARGV == 9 and ARGV[8] ~= '' then
    e = claim_bad(8)
    if e then return e end
    claim_for = ARGV[8]
  end
  local max = tonumber(ARGV[7] or '0')
  if max > 0 and #KEYS ~= 6 then
    return 'keys: want 6 KEYS (the three inboxes too) with a max_queue, got ' .. #KEYS
  elseif max == 0 and #KEYS ~= 3 and #KEYS ~= 6 then
    return 'keys: want 3 KEYS (or 6), got ' .. #KEYS
  end
  local _, why = read_typed('XLEN', 1, 'stream')
  e = why or record_bad(2, 1)
  if e then return e end
  if ARGV[5] ~= '' then  -- the pointer is written only with a caller's key
    why = key_type(KEYS[3], 'string')
    if why then return 'KEYS[3]: ' .. why end
  end
  if max > 0 then e = inboxes_bad(4) end
  return e, max, 0
end

local compact = ARGV[1] == '='
local err, max, n = check()
if err then return refuse(err) end
-- The records' (and pointers') TTL: ARGV[6], the compact form's ARGV[5].
local ttl = compact and ARGV[5] or ARGV[6]

-- The claim's lease end (server time, as the decimal string written), computed once per
-- call.
local until_ms

-- The last record this call wrote claimed and named by its msg_id (tpl), with the
-- capability and attempt it holds: every other field of such a record is the call's
-- (status, fence, owner, lease_until, agent_id) and its TTL is the call's, so the next
-- fresh record of the same capability and attempt is a COPY of it (one command, the hash
-- copied whole with its TTL) instead of an HSET of seven pairs and a PEXPIRE.
local tpl, tpl_cap, tpl_attempt

-- Add message j (its KEYS after k, its ARGV after a) and mark it pending (a status the
-- record holds already is kept as below; a record known not to exist takes all in one
-- HSET, and with a claim (claim_for ~= '') it is written claimed and the entry names the
-- owner and the lease: see the header).
local function add(inbox, rec, ptr, data, cap, attempt, msg_id, key, new)
  local id
  if rec == tpl then tpl = nil end  -- written again below: no longer what it was
  if new and claim_for ~= '' then
    if not until_ms then
      until_ms = string.format('%.0f', now_ms() + tonumber(ARGV[lease_at]))
    end
    id = redis.call('XADD', inbox, '*', 'e', data, 'c', claim_for, 'l', until_ms)
    local copied
    if tpl and key == '' and cap == tpl_cap and attempt == tpl_attempt then
      -- pcall: a user whose ACL predates COPY in reach's roles (`reach acl`) gets the
      -- HSET below, not a failed send. 0: the record exists after all (named twice in
      -- this batch), written below as before.
      copied = redis.pcall('COPY', tpl, rec)
      if copied == 1 then return id end  -- the record and its TTL (no caller's key: no pointer)
      if type(copied) == 'table' then tpl = nil end  -- refused: not tried again this call
    end
    -- No sent_msg_id: it would repeat msg_id (absent means so; a later send of the key
    -- writes it). No msg_id either for a record named by it (no caller's key: key
    -- is ''): its readers know it from the record's name. Every field costs memory in
    -- each record, and most records are named by their msg_id. (Two calls written out
    -- rather than one built as a table: a table and its unpack cost more than the HSET.)
    if key == '' then
      redis.call('HSET', rec, 'status', 'pending', 'capability', cap,
        'attempt', attempt, 'fence', '1', 'owner', claim_for,
        'lease_until', until_ms, 'agent_id', claim_agent)
      if copied == nil then tpl, tpl_cap, tpl_attempt = rec, cap, attempt end
    else
      redis.call('HSET', rec, 'status', 'pending', 'capability', cap,
        'attempt', attempt, 'fence', '1', 'owner', claim_for,
        'lease_until', until_ms, 'agent_id', claim_agent,
        'msg_id', msg_id)
    end
  elseif new then
    id = redis.call('XADD', inbox, '*', 'e', data)
    redis.call('HSET', rec, 'status', 'pending', 'capability', cap,
      'attempt', attempt, 'sent_msg_id', msg_id)
  else
    id = redis.call('XADD', inbox, '*', 'e', data)
    -- A done key (succeeded: its result stored, later copies replay it) and a running one
    -- (or one whose handler waits for input, ask.lua) keep their status; any other (dead, failed, expired, retrying: released, it runs again)
    -- is pending from now, so nobody reads the last run's outcome as this send's.
    -- A cancelled one stays cancelled for a copy of the msg_id cancelled (a retry, a moved
    -- entry: cancel.lua's cancel_of), so claim.lua never runs it; a new msg_id runs again.
    local had = redis.call('HMGET', rec, 'done', 'cancel_of', 'status', 'watched')
    if had[1] ~= '1' and had[3] ~= 'succeeded' and had[3] ~= 'running'
        and had[3] ~= 'input_required' and not (had[3] == 'cancelled' and had[2] == msg_id) then
      redis.call('HSET', rec, 'status', 'pending')
      if had[4] then announce(rec, 'pending') end
    end
    redis.call('HSET', rec, 'capability', cap, 'attempt', attempt,
      'sent_msg_id', msg_id)
  end
  redis.call('PEXPIRE', rec, ttl)
  if key ~= '' then
    redis.call('SET', ptr, key, 'PX', ttl)
  end
  return id
end

if n == 0 then
  if max > 0 and depth >= max then return depth end
  return add(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], fresh[1])
end

local out = {}
if compact then
  local inbox, cap, attempt = KEYS[tonumber(ARGV[2])], ARGV[3], ARGV[4]
  for j = 1, n do
    if max > 0 and depth >= max then
      out[j] = depth
    else
      out[j] = add(inbox, KEYS[3 + j], nil, ARGV[7 + 2 * j], cap, attempt, ARGV[8 + 2 * j], '',
        fresh[j])
      depth = depth + 1
    end
  end
  return out
end
local k, a = 0, 0
for j = 1, n do
  if max > 0 and depth >= max then
    out[j] = depth
  else
    out[j] = add(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
      ARGV[a + 4], ARGV[a + 5], fresh[j])
    depth = depth + 1
  end
  k, a = 3 * j + 3, 5 * j + 2 + fixed
end
return out
