-- drop_inbox.lua: delete an agent's inbox streams (and their consumer group) when all
-- three are empty, so the inboxes of agent ids no longer in use do not stay forever.
-- Checked and deleted in one step: a message added meanwhile keeps the inbox.
-- An agent that comes back with the same id creates its streams and group again.
--
-- KEYS[1] inbox stream, priority high
-- KEYS[2] inbox stream, priority normal
-- KEYS[3] inbox stream, priority low
-- (no ARGV)
--
-- Returns 1: dropped (or there was nothing to drop); 0: kept, an inbox holds entries
--         (the codes: DropInboxCode of lua/includes/codes.lua)
--!include codes

for i = 1, 3 do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and (t ~= 'stream' or redis.call('XLEN', KEYS[i]) > 0) then
    return DropInboxCode_KEPT
  end
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return DropInboxCode_DROPPED
