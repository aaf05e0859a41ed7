-- Arguments and reply of the decision scripts.
-- ARGV: [1] now override  [2] limit (rate per window)  [3] window in µs
--       [4] capacity  [5] cost  [6] request id
--       [7], [8] weight num, den (ratelimit.Weight)
-- Reply: {allowed, remaining, reset_us, retry_us, now_us, state...}, the
--   state being what the fallback continues from, and only that:
--   token bucket {tokens}, GCRA {tat, tat_rem}, sliding window counter
--   {window_start, current, previous}, sliding window log {age1..age8}.
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

local function reply(allowed, remaining, reset, retry, now, ...)
  return {allowed, remaining, reset, retry, now, ...}
end
