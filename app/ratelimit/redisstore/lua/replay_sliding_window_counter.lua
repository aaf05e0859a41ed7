-- Sliding window counter replay of one key. Twin of
-- ratelimit.WindowCounterReplay.
local function fold(key, limit, window, capacity, now, grants, m)
  local st = redis.call('HMGET', key, 'w', 'c', 'p', m.field)
  if marked(st[4], m.token) then return 0, 0, 0, 1 end
  local start = now - (now % window)
  local cur, prev = 0, 0
  if st[1] then
    local ws = num(st[1], 'w')
    if ws == start then
      cur, prev = num(st[2], 'c'), num(st[3], 'p')
    elseif ws == start - window then
      prev = num(st[2], 'c')
    end
  end
  local replayed, dropped = 0, 0
  for _, g in ipairs(grants) do
    local gs = g.at - (g.at % window)
    if gs >= start then
      cur = cur + g.cost
      replayed = replayed + g.cost
    elseif gs == start - window then
      prev = prev + g.cost
      replayed = replayed + g.cost
    else
      dropped = dropped + g.cost
    end
  end
  if replayed > 0 then
    redis.call('HSET', key, 'w', str(start), 'c', str(cur), 'p', str(prev), m.field, mark(st[4], m.token))
    redis.call('PEXPIRE', key, cdiv(2 * window - (now - start), 1000) + margin_ms)
  end
  return replayed, dropped, 0, 0
end
