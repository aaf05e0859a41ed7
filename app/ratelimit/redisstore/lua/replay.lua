-- The replay scripts' main part, after the algorithm's fold (twins of
-- ratelimit.*Replay). One call folds the batches of several keys (of one
-- hash tag, so one Cluster slot, unless Redis is a single node), so a
-- replay of many keys costs one script call per hundred keys or so.
-- KEYS: per batch, [3i-2] the key's state, [3i-1] the batch's marker key
--       (the window counter's replay does not use it) and [3i] the key's
--       reset fence (reset.go), all of one slot
-- ARGV: [1] now override  [2] marker TTL in ms  [3] batch count, then per
--       batch: limit, window in µs, capacity, marker field, marker token,
--       the sender's last read of the reset log (µs), grant count, and per
--       grant (sorted by time): at µs, cost, request id
-- Reply: per batch {replayed, dropped, present, duplicate}, flattened;
-- duplicate 2: fenced, nothing applied: the key was reset after the
-- sender's last read of the reset log, so the batch may hold usage the
-- reset lifted (store.ErrFenced).
-- A batch's marker is set in the same script as its state change, so a
-- batch sent twice (a retry after a failure mid-replay, a crash between the
-- replay and the journal's clearing) is applied once.
local now = now_us()
local ttl = tonumber(ARGV[2])
local reply = {}
local a = 4
-- One set of arrays for every batch: a batch's grants are at[1..n] (the
-- entries past n are a longer earlier batch's, never read).
local at, cost, id = {}, {}, {}
for b = 1, tonumber(ARGV[3]) do
  local limit, window, capacity = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local mfield, mtoken, read, n = ARGV[a + 3], ARGV[a + 4], tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6])
  a = a + 7
  for i = 1, n do
    -- A grant stamped after now (a local clock ahead of Redis') counts now,
    -- or it would lock the key until its stamp. Twin of algorithm.clampGrant.
    at[i] = math.min(num(ARGV[a], 'grant time'), now)
    cost[i] = num(ARGV[a + 1], 'grant cost')
    id[i] = ARGV[a + 2]
    a = a + 3
  end
  local o = (b - 1) * 4
  local fence = redis.call('GET', KEYS[3 * b])
  if fence and tonumber(fence) > read then
    reply[o + 1], reply[o + 2], reply[o + 3], reply[o + 4] = 0, 0, 0, 2
  else
    reply[o + 1], reply[o + 2], reply[o + 3], reply[o + 4] =
      fold(KEYS[3 * b - 2], limit, window, capacity, now, n, at, cost, id, mfield, mtoken, KEYS[3 * b - 1], ttl)
  end
end
return reply
