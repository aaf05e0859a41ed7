-- Shared helpers, prepended to every decision script.
-- ARGV: [1] now in µs (0: take the time from redis TIME, the production path)
--       [2] limit (rate per window)  [3] window in µs  [4] capacity  [5] cost
--       [6] request id  [7], [8] weight num, den (ratelimit.Weight)
-- Reply (every script): {allowed, remaining, reset_us, retry_us, now_us,
--       tokens, tat, tat_rem, window_start, current, previous, age1..age8}
-- All arithmetic stays integral and below 2^53, so float64 Lua agrees with
-- the Go twins (package ratelimit) to the bit.
local function now_us()
  local n = tonumber(ARGV[1])
  if n and n > 0 then return n end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- floor(a / b) for a >= 0, b > 0, exact despite float division.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 end
  if (q + 1) * b <= a then q = q + 1 end
  return q
end

-- ceil(a / b) for b > 0; 0 when a <= 0.
local function cdiv(a, b)
  if a <= 0 then return 0 end
  return fdiv(a + b - 1, b)
end

-- Integers as exact decimal strings (redis would format numbers with %.17g).
local function str(x) return string.format('%.0f', x) end

local function num(v, what)
  local n = tonumber(v)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then error('fleetlimit: corrupt state (' .. what .. ')') end
  return n
end

local limit, window, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local capacity = tonumber(ARGV[4])
local wnum, wden = tonumber(ARGV[7]) or 1, tonumber(ARGV[8]) or 1
if wnum < 1 then wnum, wden = 1, 1 end
-- ratelimit.Weight: cost × num/den, and limit × den/num.
local function wscale(x) return cdiv(x * wnum, wden) end
local function wunits(room, unit)
  if room <= 0 then return 0 end
  return fdiv(room, wscale(unit))
end
local elimit = fdiv(limit * wden, wnum)
local key = KEYS[1]
local margin_ms = 1000

local function reply(allowed, remaining, reset, retry, now, tokens, tat, rem, ws, cur, prev, ages)
  local r = {allowed, remaining, reset, retry, now, tokens, tat, rem, ws, cur, prev}
  for i = 1, 8 do r[11 + i] = ages and ages[i] or 0 end
  return r
end
