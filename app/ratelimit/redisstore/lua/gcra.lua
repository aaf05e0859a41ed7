-- GCRA. KEYS[1]: its state (lua/state.lua). Twin of
-- algorithm.GCRADecide.
local now = now_us()
local tolerance = capacity * window
local t0, r0, last = pair_get(key)
local again = seen(last, now)
if again then cost = 0 end
local tat, rem = now, 0
if t0 then
  t0, r0 = num(t0, 't'), num(r0, 'r')
  if t0 > now or (t0 == now and r0 > 0) then tat, rem = t0, r0 end
end
-- A held request's units count from now + hold (ratelimit.Request.Hold);
-- a refusal leaves the key as it was.
local bt, br = tat, rem
if hold > 0 and bt < now + hold then bt, br = now + hold, 0 end
local inc = wscale(cost * window)
local q = fdiv(inc, limit)
local nt, nr = bt + q, br + (inc - q * limit)
if nr >= limit then nt, nr = nt + 1, nr - limit end
local allowed, retry, moved = 0, 0, false
local ahead = (nt - now) * limit + nr
if ahead <= tolerance then
  allowed, moved = 1, nt ~= tat or nr ~= rem
  tat, rem = nt, nr
else
  retry = cdiv(ahead - tolerance, limit)
end
ahead = (tat - now) * limit + rem
local remaining = wunits(tolerance - ahead, window)
local reset = cdiv(ahead, limit)
-- Written only when the arrival time moved: a refusal, a resend and a
-- request of no units leave the key as it is (its TTL covers its state).
if moved then
  put_admitted(tat, rem, again, last, now, cdiv(reset, 1000) + margin_ms)
end
if again then allowed, retry = 1, 0 end
local r = {allowed, remaining, reset, retry, now, tat, rem}
if allowed == 0 then refusal_hint(r, last, now) end
return r
