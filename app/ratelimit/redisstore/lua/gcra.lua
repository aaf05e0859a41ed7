-- GCRA. KEYS[1]: hash {t = theoretical arrival time in µs, r = the
-- remainder in 1/limit µs}. Twin of algorithm.GCRADecide.
local now = now_us()
local tolerance = capacity * window
local st = redis.call('HMGET', key, 't', 'r', 'i')
local again = seen(st[3], now)
if again then cost = 0 end
local tat, rem = now, 0
if st[1] then
  local t0, r0 = num(st[1], 't'), num(st[2], 'r')
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
local allowed, retry = 0, 0
local ahead = (nt - now) * limit + nr
if ahead <= tolerance then
  allowed = 1
  tat, rem = nt, nr
else
  retry = cdiv(ahead - tolerance, limit)
end
ahead = (tat - now) * limit + rem
local remaining = wunits(tolerance - ahead, window)
local reset = cdiv(ahead, limit)
if reset > 0 then
  save(allowed, again, now, 't', str(tat), 'r', str(rem))
  redis.call('PEXPIRE', key, cdiv(reset, 1000) + margin_ms)
else
  redis.call('DEL', key)
end
if again then allowed, retry = 1, 0 end
local r = reply(allowed, remaining, reset, retry, now, tat, rem)
if allowed == 0 then refusal_hint(r, st[3], now) end
return r
