-- GCRA replay of one key. Twin of ratelimit.GCRAReplay.
local function fold(key, limit, window, capacity, now, grants, m)
  local st = redis.call('HMGET', key, 't', 'r', m.field)
  if marked(st[3], m.token) then return 0, 0, 0, 1 end
  local tat, rem = 0, 0
  if st[1] then tat, rem = num(st[1], 't'), num(st[2], 'r') end
  local replayed = 0
  for _, g in ipairs(grants) do
    if tat < g.at then tat, rem = g.at, 0 end
    local inc = g.cost * window
    local q = fdiv(inc, limit)
    tat, rem = tat + q, rem + (inc - q * limit)
    if rem >= limit then tat, rem = tat + 1, rem - limit end
    replayed = replayed + g.cost
  end
  -- Written even when the arrival time is already past: a later replay of
  -- another instance's grants must build on it (a past time is a full
  -- bucket for decisions, which take max(tat, now)).
  if replayed > 0 then
    redis.call('HSET', key, 't', str(tat), 'r', str(rem), m.field, mark(st[3], m.token))
    redis.call('PEXPIRE', key, cdiv(math.max(0, tat - now) + 1, 1000) + margin_ms)
  end
  return replayed, 0, 0, 0
end
