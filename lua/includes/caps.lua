-- caps.lua: taking an agent out of its capability sets.
--!include key_types

-- Remove agent `id` from the set prefix .. cap of each capability of `caps` (comma-joined,
-- as its record stores them; nil or '' for none) and keep the caps zset's count of agents
-- per capability, dropping a capability nobody declares any more. A key of another type
-- than a set cannot hold this agent: it is passed over.
local function leave_caps(caps, id, prefix, caps_zset)
  for cap in string.gmatch(caps or '', '[^,]+') do
    local set = prefix .. cap
    if not key_type(set, 'set') then
      redis.call('SREM', set, id)
      local n = redis.call('SCARD', set)
      if n == 0 then
        redis.call('ZREM', caps_zset, cap)
      else
        redis.call('ZADD', caps_zset, n, cap)
      end
    end
  end
end
