-- rate_limit.lua: take up to n starts from a rate limit (GCRA: the generic cell rate
-- algorithm, a token bucket kept as one number), for every runtime of the limit at once.
-- The state is the limit's theoretical arrival time (TAT): the server time, in µs, at which
-- the bucket would be full again. One start costs `interval` µs of it; a start is allowed
-- while TAT - now <= (burst - 1) * interval after it is taken.
--
-- KEYS[1] the limit's state (a string: the TAT in µs; absent = a full bucket)
-- ARGV[1] n: starts wanted, integer 0..100000 (0: take nothing, only answer the wait: a
--         caller asking whether a start would be allowed now)
-- ARGV[2] interval_us: µs per start (1e6 / the rate per second), integer 1..86400000000
-- ARGV[3] burst: starts allowed at once from a full bucket, integer 1..1000000
-- Integers are plain decimal digits without sign or leading zero.
--
-- Returns {granted, wait_us}: granted = starts taken now (0..n); wait_us = µs until the
-- next start would be allowed (0 when all n were granted and one more would be too).
-- The state lives until the bucket is full again (PX), so an idle limit leaves nothing.
-- Errors  'ERR reach: bad <argument>: <why>' when an argument or the key's type is out of
--         contract; nothing is taken then. A stored TAT that is not a number (written
--         behind the scripts' back) counts as a full bucket.
local MAX_N, MAX_INTERVAL, MAX_BURST = 100000, 86400000000, 1000000

--!include args
--!include key_types

local err = arity(1, 3) or int_bad('n', 1, 0, MAX_N)
  or int_bad('interval_us', 2, 1, MAX_INTERVAL) or int_bad('burst', 3, 1, MAX_BURST)
  or keys_typed({'string'})
if err then return refuse(err) end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n, interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or '') or now
if tat < now then tat = now end
-- Starts that fit: each moves TAT on by one interval; the last one taken may leave TAT at
-- most burst intervals ahead of now.
local room = math.floor((now + burst * interval - tat) / interval)
local granted = math.max(0, math.min(n, room))
tat = tat + granted * interval
if granted > 0 then
  redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX',
    math.max(1, math.ceil((tat - now) / 1000)))
end
-- The next start fits once TAT - now <= (burst - 1) * interval.
local wait = tat - (burst - 1) * interval - now
if wait < 0 then wait = 0 end
return {granted, math.floor(wait)}
