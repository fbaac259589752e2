-- send.lua: add a message to an agent's inbox and mark it pending, in one step
-- (standalone Redis; on a Cluster the client pipelines the same commands per slot).
--
-- KEYS[1] the inbox stream of the chosen agent and priority
-- KEYS[2] the message's idempotency record (hash; also its task status)
-- KEYS[3] the msg_id -> idempotency key pointer (written only when ARGV[5] ~= '')
-- ARGV[1] envelope bytes (msgpack)
-- ARGV[2] capability
-- ARGV[3] attempt
-- ARGV[4] msg_id
-- ARGV[5] caller-chosen idempotency key, or '' (the key is then the msg_id)
-- ARGV[6] ttl_ms of the record and the pointer
--
-- Returns the inbox entry id.
local id = redis.call('XADD', KEYS[1], '*', 'e', ARGV[1])
redis.call('HSETNX', KEYS[2], 'status', 'pending')
redis.call('HSET', KEYS[2], 'capability', ARGV[2], 'attempt', ARGV[3], 'sent_msg_id', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
if ARGV[5] ~= '' then
  redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[6])
end
return id
