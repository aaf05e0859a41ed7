-- Token bucket. KEYS[1]: its state (lua/state.lua): tokens × window µs,
-- and the last update in µs. Twin of algorithm.TokenBucketDecide.
local now = now_us()
local cap = capacity * window
local t0, l0, last = pair_get(key)
local again = seen(last, now)
if again then cost = 0 end
local tokens = cap
if l0 then
  tokens = refill(num(t0, 't'), num(l0, 'l'), now, cap, limit)
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
-- Written only when tokens were taken: a refusal, a resend and a request
-- of no units leave the key as it is (the bucket refills from it the same,
-- and its TTL covers it).
if allowed == 1 and need > 0 then
  put_admitted(tokens, now, again, last, now, cdiv(reset, 1000) + margin_ms)
end
if again then allowed, retry = 1, 0 end
local r = {allowed, wunits(tokens, window), reset, retry, now, tokens}
if allowed == 0 then refusal_hint(r, last, now) end
return r
