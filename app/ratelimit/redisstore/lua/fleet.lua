-- Fleet membership. KEYS[1]: sorted set of instance names scored by their
-- last heartbeat (Redis time, ms). KEYS[2]: the data generation, a random
-- string set once; a Redis that lost its data (restarted empty) has a new one.
-- KEYS[3]: the write counter, incremented by every call (see lost.go: a
-- counter that goes back under the same generation is lost writes).
-- KEYS[4]: a hash of each instance's recovery stage (see resilient's
-- recovery: "<generation token>:<stage>"), written by its beats.
-- ARGV: [1] instance  [2] "beat", "leave", "suspend" (the instance decides
--       locally from now on: it counts as suspect at once, so the others
--       hold its share back without waiting for its heartbeat to lapse) or
--       "peek" (generation only) or "cutoff" (see KEYS[5])
--       [3] missing after ms  [4] lease grace ms (how long a missing instance
--       may still be granting its fallback share)  [5] a generation to set if
--       none is  [6] the caller's deadline in Redis' time, ms (0: none): a
--       beat executed after it is no beat (see fleet.go, beatDeadline)
--       [7] the instance's recovery stage, written beside its beat ("": none)
--       [8] "cutoff" only: the oldest cutoff (µs) the caller takes
-- KEYS[5] ("cutoff" only): the fleet's charge cutoff, Redis' clock (µs) at
-- the first "cutoff" call of a recovery; one older than ARGV[8] is
-- replaced. Kept ARGV[3] ms.
-- Reply: {live, suspect, now_us (Redis' clock), generation, write counter,
-- stages}; "cutoff" appends the cutoff. Live: heartbeat within [3].
-- Suspect: missing for less than [4]: it may be cut off from Redis and
-- spending its share.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local key, ttl, grace = KEYS[1], tonumber(ARGV[3]), tonumber(ARGV[4])
local gen = redis.call('GET', KEYS[2])
if not gen then
  redis.call('SET', KEYS[2], ARGV[5])
  gen = ARGV[5]
end
local n = redis.call('INCR', KEYS[3])
if ARGV[2] == 'peek' then return {0, 0, now_us, gen, n, {}} end
if ARGV[2] == 'cutoff' then
  local c = tonumber(redis.call('GET', KEYS[5]) or '')
  if not c or c < tonumber(ARGV[8]) then
    c = now_us
    redis.call('SET', KEYS[5], string.format('%.0f', c), 'PX', ttl)
  end
  return {0, 0, now_us, gen, n, {}, c}
end
local sync = KEYS[4]
if ARGV[2] == 'leave' then
  redis.call('ZREM', key, ARGV[1])
  if sync then redis.call('HDEL', sync, ARGV[1]) end
elseif ARGV[2] == 'suspend' then
  redis.call('ZADD', key, 'XX', now - ttl - 1, ARGV[1])
else
  local deadline = tonumber(ARGV[6] or '0') or 0
  if deadline <= 0 or now <= deadline then
    redis.call('ZADD', key, now, ARGV[1])
    if sync and ARGV[7] and ARGV[7] ~= '' then redis.call('HSET', sync, ARGV[1], ARGV[7]) end
  end
end
local cutoff = '(' .. (now - ttl - grace)
if sync then
  local gone = redis.call('ZRANGEBYSCORE', key, '-inf', cutoff)
  if #gone > 0 then redis.call('HDEL', sync, unpack(gone)) end
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
redis.call('PEXPIRE', key, ttl + grace + 60000)
local live = redis.call('ZCOUNT', key, now - ttl, '+inf')
local suspect = redis.call('ZCOUNT', key, now - ttl - grace, '(' .. (now - ttl))
local stages = {}
if sync then
  redis.call('PEXPIRE', sync, ttl + grace + 60000)
  local names = redis.call('ZRANGEBYSCORE', key, now - ttl, '+inf')
  if #names > 0 then
    local v = redis.call('HMGET', sync, unpack(names))
    for i = 1, #names do stages[i] = v[i] or '' end
  end
end
return {live, suspect, now_us, gen, n, stages}
