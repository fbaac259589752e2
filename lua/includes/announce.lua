-- announce.lua: tell whoever watches a task (client.watch, docs/concepts.md "Watching a
-- task") that its record changed. A record is watched once a watcher ran watch.lua on it
-- (its field 'watched' is set): the scripts read that field with the ones they read anyway
-- and announce only then, so a message nobody watches costs nothing more.
-- The message goes out on the sharded pub/sub channel named as the record itself
-- (reach.keys.Keys.task_changes): in the record's slot, so a script that has the record in
-- KEYS publishes without building a name. The message is the new status ('running',
-- 'succeeded', ...) or 'progress:<fraction>:<note>'. pcall: a watcher's channel never
-- fails the write it follows.
local function announce(key, change)
  redis.pcall('SPUBLISH', key, change)
end
