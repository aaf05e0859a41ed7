-- The fleet's reset log (reset.go): a stream under the fleet's hash tag, one
-- entry per identity and policy whose limit an operator lifted. Every
-- instance reads it at each heartbeat from the last entry it saw, and forgets
-- what it holds of that identity under that policy (its cached refusal, its
-- snapshot, its fallback share). Bounded: the newest ARGV[1] entries, and
-- gone ARGV[2] ms after the last reset.
-- KEYS[1]: the stream.
-- ARGV: [1] max length  [2] TTL ms  [3] identity (hex)  [4] count, then per
--       policy: name, algorithm, limit, window µs, capacity
-- Reply: the reset's time, Redis µs, as a string (every entry's field at):
-- the identity's keys are fenced with it (reset.go), and an instance drops
-- from its journal only the grants made before it.
local key = KEYS[1]
local t = redis.call('TIME')
local at = t[1] .. string.format('%06d', tonumber(t[2]))
local a = 5
for _ = 1, tonumber(ARGV[4]) do
  redis.call('XADD', key, 'MAXLEN', '~', ARGV[1], '*', 'id', ARGV[3],
    'policy', ARGV[a], 'algorithm', ARGV[a + 1], 'limit', ARGV[a + 2], 'window', ARGV[a + 3], 'capacity', ARGV[a + 4],
    'at', at)
  a = a + 5
end
redis.call('PEXPIRE', key, ARGV[2])
return at
