-- GCRA replay of one key. Twin of algorithm.GCRAReplay. The state is a
-- string (lua/state.lua): the batch's marker is a key of its own, mkey.
local function fold(key, limit, window, capacity, now, n, at, cost, id, mfield, mtoken, mkey, ttl)
  local t0, r0, last = pair_get(key)
  if not redis.call('SET', mkey, '1', 'PX', ttl, 'NX') then return 0, 0, 0, 1 end
  local tat, rem = 0, 0
  if t0 then tat, rem = num(t0, 't'), num(r0, 'r') end
  local replayed = 0
  for i = 1, n do
    if tat < at[i] then tat, rem = at[i], 0 end
    local inc = cost[i] * window
    local q = fdiv(inc, limit)
    tat, rem = tat + q, rem + (inc - q * limit)
    if rem >= limit then tat, rem = tat + 1, rem - limit end
    replayed = replayed + cost[i]
  end
  -- Written even when the arrival time is already past: a later replay of
  -- another instance's grants must build on it (a past time is a full
  -- bucket for decisions, which take max(tat, now)).
  if replayed > 0 then
    pair_put(key, tat, rem, last, cdiv(math.max(0, tat - now) + 1, 1000) + replay_margin_ms)
  end
  return replayed, 0, 0, 0
end
