-- Arithmetic shared by every script. ARGV[1] is always the time override in µs
-- (0: take the time from redis TIME, the production path).
-- All arithmetic stays integral and below 2^53, so float64 Lua agrees with
-- the Go twins (package ratelimit) to the bit.
-- Keys outlive the time their state matters by this much (ms).
local margin_ms = 1000
-- A key a replay writes outlives it by this much more (ms). The other
-- instances of a recovery date their charges from the first replay (the
-- fleet's cutoff, at most 5 s before them: resilient's maxCutoffAge), and a
-- key that expired in between would take a charge dated before its expiry
-- as one on a bucket full at that time.
local replay_margin_ms = 10000

local function now_us()
  local n = ARGV[1] ~= '0' and tonumber(ARGV[1])
  if n and n > 0 then return n end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- floor(a / b) for a >= 0, b >= 1, integers. Below 2^53 the division's
-- rounding cannot cross an integer: the quotient is within a/b × 2^-53 <
-- 1/b of a/b, and a non-integral a/b is at least 1/b from the next
-- integer. Above it (a product the bounds allow, exact but past 2^53) the
-- quotient is corrected.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if a < 9007199254740992 then return q end
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
