-- Arguments and reply of the replay scripts (twins of ratelimit.*Replay).
-- KEYS: [1] the key's state  [2] the batch's idempotency marker (same slot)
-- ARGV: [1] now override  [2] limit  [3] window in µs  [4] capacity
--       [5] marker TTL in ms  [6] grant count, then per grant (sorted by
--       time): at µs, cost, request id
-- Reply: {replayed, dropped, present, duplicate}
-- The marker is checked and set in the same script as the state change, so a
-- batch sent twice (a retry after a failure mid-replay, a crash between the
-- replay and the journal's clearing) is applied once.
local limit, window, capacity = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local key, marker = KEYS[1], KEYS[2]
local margin_ms = 1000
if redis.call('EXISTS', marker) == 1 then return {0, 0, 0, 1} end
local now = now_us()
local grants = {}
for i = 1, tonumber(ARGV[6]) do
  local b = 7 + (i - 1) * 3
  -- A grant stamped after now (a local clock ahead of Redis') counts now,
  -- or it would lock the key until its stamp. Twin of ratelimit.clampGrant.
  grants[i] = {at = math.min(num(ARGV[b], 'grant time'), now), cost = num(ARGV[b + 1], 'grant cost'), id = ARGV[b + 2]}
end
redis.call('SET', marker, '1', 'PX', tonumber(ARGV[5]))
