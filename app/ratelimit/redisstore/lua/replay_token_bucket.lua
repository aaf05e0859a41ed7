-- Token bucket replay of one key. Twin of ratelimit.TokenBucketReplay.
local function fold(key, limit, window, capacity, now, grants, m)
  local cap = capacity * window
  local st = redis.call('HMGET', key, 't', 'l', m.field)
  if marked(st[3], m.token) then return 0, 0, 0, 1 end
  local tokens, last = nil, 0
  if st[2] then tokens, last = num(st[1], 't'), num(st[2], 'l') end
  local replayed = 0
  for _, g in ipairs(grants) do
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
  if last ~= 0 then
    redis.call('HSET', key, 't', str(tokens), 'l', str(last), m.field, mark(st[3], m.token))
    local full = last + cdiv(cap - tokens, limit)
    redis.call('PEXPIRE', key, cdiv(math.max(0, full - now), 1000) + margin_ms)
  end
  return replayed, 0, 0, 0
end
