-- Arguments and reply of the decision scripts.
-- ARGV: [1] now override  [2] limit (rate per window)  [3] window in µs
--       [4] capacity  [5] cost  [6] request id
--       [7], [8] weight num, den (ratelimit.Weight)
-- Reply: {allowed, remaining, reset_us, retry_us, now_us,
--         tokens, tat, tat_rem, window_start, current, previous, age1..age8}
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

local function reply(allowed, remaining, reset, retry, now, tokens, tat, rem, ws, cur, prev, ages)
  local r = {allowed, remaining, reset, retry, now, tokens, tat, rem, ws, cur, prev}
  for i = 1, 8 do r[11 + i] = ages and ages[i] or 0 end
  return r
end
