-- GCRA replay of one key. Twin of algorithm.GCRAReplay.
local function fold(key, limit, window, capacity, now, n, at, cost, id, mfield, mtoken, mkey, ttl)
  local st = redis.call('HMGET', key, 't', 'r', mfield)
  if marked(st[3], mtoken) then return 0, 0, 0, 1 end
  local tat, rem = 0, 0
  if st[1] then tat, rem = num(st[1], 't'), num(st[2], 'r') end
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
    redis.call('HSET', key, 't', str(tat), 'r', str(rem), mfield, mark(st[3], mtoken))
    redis.call('PEXPIRE', key, cdiv(math.max(0, tat - now) + 1, 1000) + margin_ms)
  end
  return replayed, 0, 0, 0
end
