-- settle.lua: complete a batch of handled messages in one atomic step (standalone Redis).
-- For each item: store the outcome in its idempotency record if the fence still matches
-- (as complete.lua), and only then publish the reply, file its dead letter or delayed
-- copy, and XACK + XDEL the inbox entry (the batch's settled entries of one inbox in one
-- XACK and one XDEL, at the end). On a Cluster the keys live in different slots, so the
-- runtime uses complete.lua and a pipeline of the same writes instead.
--
-- KEYS: every key the batch touches (idempotency records, reply streams, dead-letter
--       streams, the delayed zset, inbox streams); items refer to them by index 1..#KEYS
-- ARGV[1] ttl_ms of idempotency records and reply streams: integer 1..31536000000 (365 days)
-- ARGV[2] the inbox consumer group: 1..1024 bytes
-- ARGV[3] n: the number of items; then each item, from p = 4 on, in fixed slots:
--   ARGV[p]   record index: the idempotency record to complete (0 = none)
--   ARGV[p+1] fence: integer 1..2^53 (read only with a record)
--   ARGV[p+2] status: succeeded | failed | retrying | expired | dead (only with a record)
--   ARGV[p+3] stored reply bytes: stored for mode 'done' (the record's short form of the
--             reply, docs/protocol.md), else not read
--   ARGV[p+4] mode: 'done' (store the reply, later deliveries replay it) | 'release' (the
--             key may run again) (only with a record)
--   ARGV[p+5] error text for the status (only with a record)
--   ARGV[p+6] reply bytes: published to the reply stream (read only with one)
--   ARGV[p+7] reply stream index (0 = publish no reply): XADD <stream> MAXLEN ~
--             <StreamBound.REPLIES> * r <reply>; after the items, PEXPIRE <stream> ttl_ms
--             (once per stream a reply was published to)
--   ARGV[p+8] inbox index (0 = no ack): XACK <inbox> <group> <entry id>, XDEL <inbox> <id>
--   ARGV[p+9] entry id: a stream id 'ms-seq' or 'ms' (read only with an inbox)
--   ARGV[p+10] follow-up: 0 none | 1 a dead letter | 2 a delayed copy (a retry, or a
--             parked copy of a busy key) (FollowUpKind of lua/includes/codes.lua); its
--             slots come next:
--   dead letter, 11 slots:
--     ARGV[p+11] dead-letter stream index (1..#KEYS), ARGV[p+12] maxlen (integer 0..2^53), then the
--     values of the entry's fields: ARGV[p+13] reason, [p+14] error, [p+15] error_type,
--     [p+16] attempts (integer 0..2^53), [p+17] agent_id, [p+18] msg_id, [p+19] capability,
--     [p+20] ts (epoch ms, integer 0..2^53), [p+21] env (the envelope's bytes)
--     written as: XADD <stream> MAXLEN ~ <maxlen> * reason <..> error <..> error_type <..>
--       attempts <..> agent_id <..> msg_id <..> capability <..> ts <..> env <..>
--     (the fields and their order are those of reach.tasks.dead_letter_op: the CLI, the
--     admin module and agents in other languages read them)
--   delayed copy, 3 slots:
--     ARGV[p+11] delayed zset index (1..#KEYS), ARGV[p+12] due (epoch ms, integer 0..2^53),
--     ARGV[p+13] the envelope's bytes; written as: ZADD <zset> <due> <envelope>
--   The next item starts after them: p + 11, p + 22 or p + 14.
-- A plain success (the usual item: status 'succeeded', mode 'done', no error, no reply
-- to publish, no follow-up) may come in 5 slots instead, told apart by its first:
--   ARGV[p]   '+' and the record index (1..#KEYS): the record to complete, e.g. '+3'
--   ARGV[p+1] fence, ARGV[p+2] stored reply bytes (as the full form's p+1 and p+3)
--   ARGV[p+3] inbox index (0 = no ack), ARGV[p+4] entry id (as the full form's p+8, p+9)
--   It is settled as the full form with those values would settle it (fewer arguments
--   for Redis to read and the script to check). The next item starts at p + 5.
-- A run of k such plain successes that share a fence and an inbox, whose records are k
-- consecutive KEYS, may come in 4 + 2k slots, told apart by its first:
--   ARGV[p]   '*' and k (1..the items left), e.g. '*20': the run counts as k items
--   ARGV[p+1] fence (of each), ARGV[p+2] inbox index (0 = no ack, of each)
--   ARGV[p+3] the first record's index r: item j of the run (0-based) completes KEYS[r + j]
--   then for j = 0..k-1: ARGV[p+4+2j] stored reply bytes, ARGV[p+5+2j] entry id
--   Each is settled as its own 5-slot form would settle it. The next item starts at
--   p + 4 + 2k.
-- After the items, optional (absent: the items use ARGV exactly), from q on:
--   ARGV[q]   k: the number of failure details that follow (integer 0..n), then k triples:
--   ARGV[q+1] item number (1..n, ascending, each at most once), ARGV[q+2] the handler's
--             exception type, ARGV[q+3] its traceback (text, already bounded by the caller)
--   A settled item with a detail gets, in its record (if any): HSET error_type <..>
--   traceback <..>; in its dead letter (if any): a last field traceback <..> after env.
--   A settled record without a detail that ran more than once loses both fields (HDEL):
--   they described an earlier attempt.
--   Then, optional too (only after the details, whose count may be 0), the index of
--   recent messages (reach.recent), written for the batch whatever became of its items:
--   ARGV[r] the index stream's key index (1..#KEYS), ARGV[r+1] maxlen (integer 0..2^53),
--   ARGV[r+2] c: the number of chunks (integer 0..n), then c values, each written as
--   XADD <stream> MAXLEN ~ <maxlen> * m <chunk> (a chunk: the packed rows of up to 64
--   messages; its bytes are the caller's, read by nobody here).
--   So #ARGV = 3 + what the items describe (+ 1 + 3k with the details, + 3 + c with the
--   index).
-- Integers are plain decimal digits without sign or leading zero. Text and bytes slots take
-- any bytes.
--
-- A watched record settled announces its new status (lua/includes/announce.lua); a
-- fenced item announces nothing.
--
-- Everything is checked before the first write, so a refused batch writes nothing (Redis
-- does not roll a script back): every count, index, number and word above, and the type
-- of every key against each use of it (record: a hash; reply stream, inbox, dead-letter
-- stream: a stream; delayed: a sorted set; or absent), including one key used as two types.
--
-- Returns one code per item: 1 settled (record completed, reply published, follow-up
-- written, entry acked and deleted); 0 fenced: another owner claimed the key since, nothing
-- was written for this item (not even the ack)
--         (the codes: SettleCode of lua/includes/codes.lua)
-- Errors  'reach: bad <argument>: <why>' (an error reply 'ERR reach: ...'; redis-py raises
--         ResponseError), e.g. 'reach: bad follow-up of item 2 (ARGV[25]) 7: want 0, 1 or 2'.
--         Only a bug or a hostile caller gets one: the runtime never sends such a call.
--!include fence
--!include now
local MAX_TTL, MAX_INT = 31536000000, 9007199254740992
local U64 = '18446744073709551615'

-- A stream entry id XACK and XDEL accept: 'ms-seq' or 'ms', each part 0..2^64-1 (a part
-- of 20 digits is compared with 2^64-1 as a string).
local function stream_id_ok(v)
  if #v < 20 then  -- every part shorter than 2^64-1's 20 digits: the digits alone decide
    return string.find(v, '^%d+%-%d+$') ~= nil or string.find(v, '^%d+$') ~= nil
  end
  local dash = string.find(v, '-', 1, true)
  if not dash then
    return #v >= 1 and string.find(v, '^%d+$') ~= nil and (#v < 20 or (#v == 20 and v <= U64))
  end
  local ms, seq = dash - 1, #v - dash
  if ms < 1 or seq < 1 or ms > 20 or seq > 20 or not string.find(v, '^%d+%-%d+$') then
    return false
  end
  return (ms < 20 or string.sub(v, 1, 20) <= U64) and (seq < 20 or string.sub(v, dash + 1) <= U64)
end

-- Each follow-up kind: the label of its key index (its first slot), how many slots it
-- takes after the item's 11, the type of the key it writes, and its integer slots (offset
-- from the first slot, label). Built at the first follow-up of a call: the script runs
-- from the top at every call, and most batches have none (tables cost per call).
local DEAD_LETTER, RETRY = FollowUpKind_DEAD_LETTER, FollowUpKind_RETRY
local FOLLOW_UPS
local function follow_ups()
  if not FOLLOW_UPS then
    FOLLOW_UPS = {
      [DEAD_LETTER] = {'dead-letter stream index', 11, 'stream', {{1, 'maxlen'},
        {5, 'attempts'}, {9, 'ts'}}},
      [RETRY] = {'delayed index', 3, 'zset', {{1, 'due'}}},
    }
  end
  return FOLLOW_UPS
end

-- ' of item 2': built only for an error message.
local function where(item)
  return ' of item ' .. item
end

-- The records' fence, done and runs fields as the check pass read them, by key index.
local reads = {}
-- The failure details, by item number: the ARGV index of the detail's item number (nil:
-- the call has none).
local details
-- The ARGV index of the recent index's section (nil: none).
local recent
-- The record index of each plain success's first slot ('+3' -> 3), as the check pass
-- parsed it (apart from `parsed`: '+3' is no integer any other slot may take).
local plain = {}
-- The length of each run of plain successes ('*k'), by the ARGV index of its first slot.
local runs = {}

local function check()
  local na, nk = #ARGV, #KEYS
  if na < 3 then return 'arguments: want at least 3 ARGV, got ' .. na end
  local e = int_bad('ttl_ms', 1, 1, MAX_TTL) or bytes_bad('group', 2, 1, 1024)
  if e then return e end
  -- (2 ARGV an item at least: a plain success in a run takes 2, and its run 4 more)
  local most = math.floor((na - 3) / 2)
  local n = int_memo(ARGV[3], 0, most)
  if not n then
    return bad('number of items', 3, 'want an integer 0..' .. most .. ' (2 ARGV per item at least)')
  end
  -- The type each key index is used as, and its first use (for the error message: label
  -- and item in one table, at 2i - 1 and 2i; one table less to build per call).
  local need, first = {}, {}
  local function use(i, kind, label, item)
    local had = need[i]
    if not had then
      need[i], first[2 * i - 1], first[2 * i] = kind, label, item
    elseif had ~= kind then
      return label .. where(item) .. ': KEYS[' .. i .. '] is used as a ' .. had .. ' by '
        .. first[2 * i - 1] .. where(first[2 * i]) .. ', here as a ' .. kind
    end
    return nil
  end
  local function index_bad(p, label, item, lo)
    return bad(label .. where(item), p, 'want a key index ' .. lo .. '..' .. nk)
  end
  -- Why ARGV[p], a key index lo..#KEYS (lo 0: none allowed) used as a `kind`, is refused,
  -- or nil (the follow-ups' indexes; an item's own three are checked inline below).
  local function key_index(p, label, kind, item, lo)
    local i = int_memo(ARGV[p], lo, nk)
    if not i then return index_bad(p, label, item, lo) end
    if i == 0 or need[i] == kind then return nil end
    return use(i, kind, label, item)
  end
  -- An item's three key indexes, in this order: the record's (then its completion), the
  -- reply stream's, the inbox's (then its entry id). Written out rather than through
  -- key_index: a few calls less per item, and most indexes repeat (the inbox's, 0), so
  -- int_memo's table answers them before any call.
  local memo = parsed
  -- Why the inbox index at ARGV[q] (and the entry id after it) is refused, or nil.
  local function inbox_bad(q, item)
    local v = ARGV[q]
    local i = memo[v]
    if not i or i > nk then i = int_memo(v, 0, nk) end
    if not i then return index_bad(q, 'inbox index', item, 0) end
    if i > 0 then
      if not stream_id_ok(ARGV[q + 1]) then
        return bad('entry id' .. where(item), q + 1, "want a stream id 'ms-seq'")
      end
      if need[i] ~= 'stream' then return use(i, 'stream', 'inbox index', item) end
    end
    return nil
  end
  local p = 4
  local item = 1
  while item <= n do
    local v = ARGV[p]
    if p + 4 > na then
      return 'arguments: item ' .. item .. ' starts at ARGV[' .. p .. '], needs 5 ARGV at least, '
        .. na .. ' in all'
    end
    local b = string.byte(v, 1)
    if b == 42 then  -- '*': a run of k plain successes, in 4 + 2k slots
      local k = int_memo(string.sub(v, 2), 1, n - item + 1)
      if not k then
        return bad('run length' .. where(item), p, "want '*' and 1.." .. (n - item + 1)
          .. ' (the items left)')
      end
      if p + 3 + 2 * k > na then
        return 'arguments: the run' .. where(item) .. ' starts at ARGV[' .. p .. '], needs '
          .. (4 + 2 * k) .. ' ARGV, ' .. na .. ' in all'
      end
      if not int_memo(ARGV[p + 1], 1, MAX_FENCE) then
        return bad('fence' .. where(item), p + 1, 'want an integer 1..2^53')
      end
      local r = int_memo(ARGV[p + 3], 1, nk - k + 1)
      if not r then
        return bad('first record index' .. where(item), p + 3, 'want a key index 1..'
          .. (nk - k + 1) .. ' (its ' .. k .. ' records in a row)')
      end
      for j = 0, k - 1 do
        if need[r + j] ~= 'hash' then
          e = use(r + j, 'hash', 'record index', item + j)
          if e then return e end
        end
      end
      -- The inbox index once, then each entry id (as inbox_bad checks one item's).
      v = ARGV[p + 2]
      local i = memo[v]
      if not i or i > nk then i = int_memo(v, 0, nk) end
      if not i then return index_bad(p + 2, 'inbox index', item, 0) end
      if i > 0 then
        for j = 0, k - 1 do
          if not stream_id_ok(ARGV[p + 5 + 2 * j]) then
            return bad('entry id' .. where(item + j), p + 5 + 2 * j, "want a stream id 'ms-seq'")
          end
        end
        if need[i] ~= 'stream' then
          e = use(i, 'stream', 'inbox index', item)
          if e then return e end
        end
      end
      runs[p] = k
      p = p + 4 + 2 * k
      item = item + k - 1
    elseif b == 43 then  -- '+': a plain success, in 5 slots
      local i = plain[v]
      if not i then
        i = int_memo(string.sub(v, 2), 1, nk)
        if not i then
          return bad('record index' .. where(item), p, "want '+' and a key index 1.." .. nk)
        end
        plain[v] = i
      end
      if not int_memo(ARGV[p + 1], 1, MAX_FENCE) then
        return bad('fence' .. where(item), p + 1, 'want an integer 1..2^53')
      end
      e = (need[i] ~= 'hash' and use(i, 'hash', 'record index', item)) or inbox_bad(p + 3, item)
      if e then return e end
      p = p + 5
    else
      if p + 10 > na then
        return 'arguments: item ' .. item .. ' starts at ARGV[' .. p .. '], needs 11 ARGV, ' .. na .. ' in all'
      end
      local i = memo[v]
      if not i or i > nk then i = int_memo(v, 0, nk) end
      if not i then return index_bad(p, 'record index', item, 0) end
      if i > 0 then
        e = completion_bad(p + 1, where, item)
          or (need[i] ~= 'hash' and use(i, 'hash', 'record index', item))
        if e then return e end
      end
      v = ARGV[p + 7]
      i = memo[v]
      if not i or i > nk then i = int_memo(v, 0, nk) end
      if not i then return index_bad(p + 7, 'reply stream index', item, 0) end
      if i > 0 and need[i] ~= 'stream' then
        e = use(i, 'stream', 'reply stream index', item)
        if e then return e end
      end
      e = inbox_bad(p + 8, item)
      if e then return e end
      v = ARGV[p + 10]
      local kind = memo[v]
      if not kind or kind > RETRY then kind = int_memo(v, FollowUpKind_NONE, RETRY) end
      if not kind then return bad('follow-up' .. where(item), p + 10, 'want 0, 1 or 2') end
      p = p + 11
      if kind ~= FollowUpKind_NONE then
        local f = follow_ups()[kind]
        if p + f[2] - 1 > na then
          return 'arguments: the follow-up' .. where(item) .. ' starts at ARGV[' .. p .. '], needs '
            .. f[2] .. ' ARGV, ' .. na .. ' in all'
        end
        e = key_index(p, f[1], f[3], item, 1)
        if e then return e end
        for _, slot in ipairs(f[4]) do
          if not int_memo(ARGV[p + slot[1]], 0, MAX_INT) then
            return bad(slot[2] .. where(item), p + slot[1], 'want an integer 0..2^53')
          end
        end
        p = p + f[2]
      end
    end
    item = item + 1
  end
  if p <= na then
    local k = int_memo(ARGV[p], 0, n)
    if not k then return bad('number of details', p, 'want an integer 0..' .. n) end
    if p + 3 * k > na then
      return 'arguments: ' .. k .. ' details after ARGV[' .. p .. '] need ' .. (3 * k)
        .. ' ARGV, got ' .. (na - p)
    end
    local last = 0
    if k > 0 then details = {} end
    for j = 1, k do
      local d = p + 3 * (j - 1) + 1
      local item = int_memo(ARGV[d], last + 1, n)
      if not item then
        return bad('item number of detail ' .. j, d, 'want an integer ' .. (last + 1) .. '..' .. n)
      end
      details[item], last = d, item
    end
    p = p + 3 * k + 1
  end
  if p <= na then
    if p + 2 > na then
      return 'arguments: the index after ARGV[' .. (p - 1) .. '] needs 3 ARGV at least, got '
        .. (na - p + 1)
    end
    e = key_index(p, 'recent index', 'stream', 0, 1)
    if e then return e end
    if not int_memo(ARGV[p + 1], 0, MAX_INT) then
      return bad('recent maxlen', p + 1, 'want an integer 0..2^53')
    end
    local c = int_memo(ARGV[p + 2], 0, n)
    if not c then return bad('number of chunks', p + 2, 'want an integer 0..' .. n) end
    if p + 2 + c ~= na then
      return 'arguments: ' .. c .. ' chunks after ARGV[' .. (p + 2) .. '], got ' .. (na - p - 2)
    end
    recent = p
    p = na + 1
  end
  if p ~= na + 1 then
    return 'arguments: the ' .. n .. ' items end at ARGV[' .. (p - 1) .. '], got ' .. na .. ' ARGV'
  end
  for i = 1, nk do
    local want = need[i]
    local kind
    if want == 'hash' then
      -- A record is read here (kept for the write pass) instead of asked its TYPE: one
      -- command, and HMGET fails on exactly what is not a hash.
      local rec = redis.pcall('HMGET', KEYS[i], 'fence', 'done', 'runs', 'steps', 'watched')
      if rec['err'] then kind = redis.call('TYPE', KEYS[i])['ok'] else reads[i] = rec end
    elseif want then
      kind = redis.call('TYPE', KEYS[i])['ok']
    end
    if kind and kind ~= want and kind ~= 'none' then
      return 'KEYS[' .. i .. ']: holds a ' .. kind .. ', ' .. first[2 * i - 1]
        .. where(first[2 * i]) .. ' wants a ' .. want
    end
  end
end

local err = check()
if err then return refuse(err) end

-- Write the follow-up of kind `kind` (not NONE) whose slots start at ARGV[f].
-- d: the ARGV index of the item's failure detail (nil: none).
local function follow_up(kind, f, d)
  if kind == DEAD_LETTER then
    -- The dead-letter entry's fields, in the order of reach.tasks.dead_letter_op (a table
    -- built here, for a dead letter, not at every call).
    local fields = {'reason', 'error', 'error_type', 'attempts', 'agent_id', 'msg_id',
      'capability', 'ts', 'env'}
    local args = {'XADD', KEYS[tonumber(ARGV[f])], 'MAXLEN', '~', ARGV[f + 1], '*'}
    for j, field in ipairs(fields) do
      args[5 + 2 * j], args[6 + 2 * j] = field, ARGV[f + 1 + j]
    end
    if d then args[#args + 1], args[#args + 2] = 'traceback', ARGV[d + 2] end
    redis.call(unpack(args))
  elseif kind == RETRY then
    redis.call('ZADD', KEYS[tonumber(ARGV[f])], ARGV[f + 1], ARGV[f + 2])
  end
end

-- The settled entries' ids, by inbox index, in item order: acked and deleted at the end,
-- one XACK and one XDEL per inbox (the script is atomic: nobody sees the order of its
-- writes, and an entry is still acked only if its completion was written).
local acks, inboxes = {}, {}
local group = ARGV[2]

-- XACK and XDEL of ids (in chunks: unpack has a limit on the values it returns).
local CHUNK = 1000
local function ack_all(key, ids)
  for first = 1, #ids, CHUNK do
    local last = math.min(#ids, first + CHUNK - 1)
    redis.call('XACK', key, group, unpack(ids, first, last))
    redis.call('XDEL', key, unpack(ids, first, last))
  end
end

-- Strings, not Lua numbers: Redis formats a number argument anew at every call.
local now = string.format('%.0f', now_ms())
local REPLIES = string.format('%d', StreamBound_REPLIES)
local ttl = ARGV[1]
local NONE = FollowUpKind_NONE
local p = 4
local out = {}
-- Records completed by this call, by key (a later item of the same one reads it again),
-- and the reply streams written to, by their negated index (one table for both: a table
-- costs more per call than its lookups).
local seen = {}
local reply_streams = {}  -- the reply streams written to, in order
-- The check pass parsed every index and kind below (int_memo): looked up, not parsed again.
local num = parsed

-- Complete record KEYS[ki] for an item with this fence, status, stored reply,
-- mode and error, and what its record takes of its detail; SettleCode_SETTLED or FENCED.
local function complete(item, ki, fence, status, stored, mode, err)
  local key = KEYS[ki]
  local rec = reads[ki]
  if seen[key] then rec = redis.call('HMGET', key, 'fence', 'done', 'runs', 'steps', 'watched') end
  seen[key] = true
  local code = complete_record(key, rec, fence, status, stored, mode, err, ttl, now)
  if code == SettleCode_SETTLED then
    local d = details and details[item]
    if d then
      redis.call('HSET', key, 'error_type', ARGV[d + 1], 'traceback', ARGV[d + 2])
    elseif rec[3] and rec[3] ~= '0' and rec[3] ~= '1' then
      redis.call('HDEL', key, 'error_type', 'traceback')
    end
  end
  return code
end

-- Note entry id `entry` of inbox KEYS[ii] (ii > 0) for the ack at the end.
local function ack_later(ii, entry)
  local ids = acks[ii]
  if not ids then
    ids = {}
    acks[ii] = ids
    inboxes[#inboxes + 1] = ii
  end
  ids[#ids + 1] = entry
end

local item = 1
local n_items = num[ARGV[3]]
while item <= n_items do
  local k = runs[p]
  if k then  -- a run of k plain successes: records KEYS[r..r+k-1], one fence, one inbox
    local fence, ii, r = ARGV[p + 1], num[ARGV[p + 2]], num[ARGV[p + 3]]
    for j = 0, k - 1 do
      local code = complete(item + j, r + j, fence, 'succeeded', ARGV[p + 4 + 2 * j], 'done', '')
      if code == SettleCode_SETTLED and ii > 0 then ack_later(ii, ARGV[p + 5 + 2 * j]) end
      out[item + j] = code
    end
    item = item + k
    p = p + 4 + 2 * k
  else
    local ki, ri, ii, kind, entry, size
    local pi = plain[ARGV[p]]
    if pi then  -- a plain success (5 slots)
      ki, ri, ii, kind, entry, size = pi, 0, num[ARGV[p + 3]], NONE, ARGV[p + 4], 5
    else
      ki, ri, ii, kind = num[ARGV[p]], num[ARGV[p + 7]], num[ARGV[p + 8]], num[ARGV[p + 10]]
      entry, size = ARGV[p + 9], 11
    end
    local code = SettleCode_SETTLED
    if ki > 0 then
      if pi then
        code = complete(item, ki, ARGV[p + 1], 'succeeded', ARGV[p + 2], 'done', '')
      else
        code = complete(item, ki, ARGV[p + 1], ARGV[p + 2], ARGV[p + 3], ARGV[p + 4], ARGV[p + 5])
      end
    end
    if code == SettleCode_SETTLED then
      if ri > 0 then
        redis.call('XADD', KEYS[ri], 'MAXLEN', '~', REPLIES, '*', 'r', ARGV[p + 6])
        if not seen[-ri] then
          seen[-ri] = true
          reply_streams[#reply_streams + 1] = ri
        end
      end
      if kind ~= NONE then follow_up(kind, p + 11, details and details[item]) end
      if ii > 0 then ack_later(ii, entry) end
    end
    p = p + size
    if kind ~= NONE then p = p + follow_ups()[kind][2] end
    out[item] = code
    item = item + 1
  end
end
-- A caller's replies of one batch share its stream: one PEXPIRE for them all (the script
-- is atomic, so the stream's expiry is the same as after each reply).
for _, ri in ipairs(reply_streams) do redis.call('PEXPIRE', KEYS[ri], ttl) end
for _, ii in ipairs(inboxes) do ack_all(KEYS[ii], acks[ii]) end
if recent then
  local key, maxlen = KEYS[tonumber(ARGV[recent])], ARGV[recent + 1]
  for j = recent + 3, #ARGV do
    redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', 'm', ARGV[j])
  end
end
return out
