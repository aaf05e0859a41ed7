-- Sliding window counter replay of one key. Twin of
-- algorithm.WindowCounterReplay.
local function fold(key, limit, window, capacity, now, n, at, cost, id, mfield, mtoken, mkey, ttl)
  local st = redis.call('HMGET', key, 'w', 'c', 'p', mfield)
  if marked(st[4], mtoken) then return 0, 0, 0, 1 end
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
  for i = 1, n do
    local gs = at[i] - (at[i] % window)
    if gs >= start then
      cur = cur + cost[i]
      replayed = replayed + cost[i]
    elseif gs == start - window then
      prev = prev + cost[i]
      replayed = replayed + cost[i]
    else
      dropped = dropped + cost[i]
    end
  end
  if replayed > 0 then
    redis.call('HSET', key, 'w', str(start), 'c', str(cur), 'p', str(prev), mfield, mark(st[4], mtoken))
    redis.call('PEXPIRE', key, cdiv(2 * window - (now - start), 1000) + margin_ms)
  end
  return replayed, dropped, 0, 0
end
