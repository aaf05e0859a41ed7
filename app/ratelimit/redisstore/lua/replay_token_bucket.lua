-- Token bucket replay of one key. Twin of algorithm.TokenBucketReplay.
local function fold(key, limit, window, capacity, now, n, at, cost, id, mfield, mtoken, mkey, ttl)
  local cap = capacity * window
  local st = redis.call('HMGET', key, 't', 'l', mfield)
  if marked(st[3], mtoken) then return 0, 0, 0, 1 end
  local tokens, last = nil, 0
  if st[2] then tokens, last = num(st[1], 't'), num(st[2], 'l') end
  local replayed = 0
  for i = 1, n do
    if last == 0 then tokens, last = cap, at[i] end
    if at[i] > last then
      tokens, last = refill(tokens, last, at[i], cap, limit), at[i]
    end
    tokens = tokens - cost[i] * window
    replayed = replayed + cost[i]
  end
  if last ~= 0 then
    redis.call('HSET', key, 't', str(tokens), 'l', str(last), mfield, mark(st[3], mtoken))
    local full = last + cdiv(cap - tokens, limit)
    redis.call('PEXPIRE', key, cdiv(math.max(0, full - now), 1000) + margin_ms)
  end
  return replayed, 0, 0, 0
end
