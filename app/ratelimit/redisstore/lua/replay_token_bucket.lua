-- Token bucket replay of one key. Twin of algorithm.TokenBucketReplay. The
-- state is a string (lua/state.lua): the batch's marker is a key of its
-- own, mkey.
local function fold(key, limit, window, capacity, now, n, at, cost, id, mfield, mtoken, mkey, ttl)
  local cap = capacity * window
  local t0, l0, adm = pair_get(key)
  if not redis.call('SET', mkey, '1', 'PX', ttl, 'NX') then return 0, 0, 0, 1 end
  local tokens, last = nil, 0
  if l0 then tokens, last = num(t0, 't'), num(l0, 'l') end
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
    local full = last + cdiv(cap - tokens, limit)
    pair_put(key, tokens, last, adm, cdiv(math.max(0, full - now), 1000) + replay_margin_ms)
  end
  return replayed, 0, 0, 0
end
