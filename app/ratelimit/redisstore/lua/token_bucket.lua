-- Token bucket. KEYS[1]: hash {t = tokens × window µs, l = last update µs}.
-- Twin of algorithm.TokenBucketDecide.
local now = now_us()
local cap = capacity * window
local st = redis.call('HMGET', key, 't', 'l', 'i')
local again = seen(st[3], now)
if again then cost = 0 end
local tokens = cap
if st[2] then
  tokens = refill(num(st[1], 't'), num(st[2], 'l'), now, cap, limit)
end
local allowed, retry = 0, 0
local need = wscale(cost * window)
if tokens >= need then
  allowed = 1
  tokens = tokens - need
else
  retry = cdiv(need - tokens, limit)
end
local reset = cdiv(cap - tokens, limit)
save(allowed, again, now, 't', str(tokens), 'l', str(now))
redis.call('PEXPIRE', key, cdiv(reset, 1000) + margin_ms)
if again then allowed, retry = 1, 0 end
local r = reply(allowed, wunits(tokens, window), reset, retry, now, tokens)
if allowed == 0 then refusal_hint(r, st[3], now) end
return r
