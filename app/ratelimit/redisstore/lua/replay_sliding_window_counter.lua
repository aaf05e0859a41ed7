-- Sliding window counter replay. Twin of ratelimit.WindowCounterReplay.
local start = now - (now % window)
local cur, prev = counter_state(key, start, window)
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
if cur > 0 or prev > 0 then
  redis.call('HSET', key, 'w', str(start), 'c', str(cur), 'p', str(prev))
  redis.call('PEXPIRE', key, cdiv(2 * window - (now - start), 1000) + margin_ms)
end
return {replayed, dropped, 0, 0}
