-- Arguments and reply of the decision scripts.
-- ARGV: [1] now override  [2] limit (rate per window)  [3] window in µs
--       [4] capacity  [5] cost  [6] request id
--       [7], [8] weight num, den (ratelimit.Weight)
--       [9] resend window in µs (lua/once.lua; absent: 3 s)
-- Reply: {allowed, remaining, reset_us, retry_us, now_us, state...}, the
--   state being what the fallback continues from, and only that:
--   token bucket {tokens}, GCRA {tat, tat_rem}, sliding window counter
--   {window_start, current, previous}, sliding window log {age1..age8};
--   then, on a refusal only, possibly {resend_id, resend_until_us}
--   (resend_hint).
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

local resend_us = tonumber(ARGV[9]) or 3000000

local function reply(allowed, remaining, reset, retry, now, ...)
  return {allowed, remaining, reset, retry, now, ...}
end

-- Whether a request at now is within the resend window of an admission at
-- at (either side: a clock that stepped back less than the window still
-- recognises a resend). Twin of algorithm.Admission.Resend.
local function resent(at, now)
  return math.abs(now - at) < resend_us
end

-- Appends to the reply r of a refusal the key's last admission (request id,
-- and the Redis time in µs until which a request with that id is taken for
-- a resend of it and admitted) while that time is ahead: a cache of this
-- refusal must not answer that request (ratelimit.Decision.ResendID).
local function resend_hint(r, id, at, now)
  if id ~= '' and resent(at, now) then
    r[#r + 1] = id
    r[#r + 1] = at + resend_us
  end
end
