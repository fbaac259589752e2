-- announce.lua: tell whoever watches a task (client.watch, docs/concepts.md "Watching a
-- task") that its record changed. The message goes out on the sharded pub/sub channel
-- named as the record itself (reach.keys.Keys.task_changes): in the record's slot, so a
-- script that has the record in KEYS publishes without building a name. The message is
-- the new status ('running', 'succeeded', ...) or 'progress:<fraction>:<note>'. With no
-- subscriber Redis drops it and keeps nothing, so an unwatched task costs one lookup.
-- pcall: a watcher's channel never fails the write it follows.
local function announce(key, change)
  redis.pcall('SPUBLISH', key, change)
end
