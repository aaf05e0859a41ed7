-- Fleet membership. KEYS[1]: sorted set of instance names scored by their
-- last heartbeat (Redis time, ms).
-- ARGV: [1] instance  [2] "beat" or "leave"  [3] missing after ms
--       [4] lease grace ms (how long a missing instance may still be granting
--       its fallback share)
-- Reply: {live, suspect, now_ms}. Live: heartbeat within [3]. Suspect: missing
-- for less than [4]: it may be cut off from Redis and spending its share.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key, ttl, grace = KEYS[1], tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[2] == 'leave' then
  redis.call('ZREM', key, ARGV[1])
else
  redis.call('ZADD', key, now, ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. (now - ttl - grace))
redis.call('PEXPIRE', key, ttl + grace + 60000)
local live = redis.call('ZCOUNT', key, now - ttl, '+inf')
local suspect = redis.call('ZCOUNT', key, now - ttl - grace, '(' .. (now - ttl))
return {live, suspect, now}
