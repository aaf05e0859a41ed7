-- Token bucket replay. Twin of ratelimit.TokenBucketReplay.
local cap = capacity * window
local st = redis.call('HMGET', key, 't', 'l')
local tokens, last = nil, 0
if st[2] then tokens, last = num(st[1], 't'), num(st[2], 'l') end
local replayed, dropped = 0, 0
for _, g in ipairs(grants) do
  do
    if last == 0 then tokens, last = cap, g.at end
    if g.at > last then
      local elapsed = g.at - last
      if tokens >= cap or elapsed >= cdiv(cap - tokens, limit) then
        tokens = cap
      else
        tokens = tokens + elapsed * limit
      end
      last = g.at
    end
    tokens = tokens - g.cost * window
    replayed = replayed + g.cost
  end
end
if last ~= 0 then
  redis.call('HSET', key, 't', str(tokens), 'l', str(last))
  local full = last + cdiv(cap - tokens, limit)
  redis.call('PEXPIRE', key, cdiv(math.max(0, full - now), 1000) + margin_ms)
end
return {replayed, dropped, 0, 0}
