-- The fleet's reset log (reset.go): a stream under the fleet's hash tag, one
-- entry per identity and policy whose limit an operator lifted. Every
-- instance reads it at each heartbeat from the last entry it saw, and forgets
-- what it holds of that identity under that policy (its cached refusal, its
-- snapshot, its fallback share). Bounded: the newest ARGV[1] entries, and
-- gone ARGV[2] ms after the last reset.
-- KEYS[1]: the stream.
-- ARGV: [1] max length  [2] TTL ms  [3] identity (hex)  [4] count, then per
--       policy: name, algorithm, limit, window µs, capacity
-- Reply: the id of the last entry added.
local key = KEYS[1]
local last = ''
local a = 5
for _ = 1, tonumber(ARGV[4]) do
  last = redis.call('XADD', key, 'MAXLEN', '~', ARGV[1], '*', 'id', ARGV[3],
    'policy', ARGV[a], 'algorithm', ARGV[a + 1], 'limit', ARGV[a + 2], 'window', ARGV[a + 3], 'capacity', ARGV[a + 4])
  a = a + 5
end
redis.call('PEXPIRE', key, ARGV[2])
return last
