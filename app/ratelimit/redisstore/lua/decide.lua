-- Arguments and reply of the decision scripts.
-- ARGV: [1] now override  [2] limit (rate per window)  [3] window in µs
--       [4] capacity  [5] cost  [6] request id
--       [7], [8] weight num, den (ratelimit.Weight)
--       [9] resend window in µs (lua/once.lua; absent: 3 s)
--       [10] hold in µs (GCRA only; ratelimit.Request.Hold; absent: 0)
-- Reply: {allowed, remaining, reset_us, retry_us, now_us, state...}, the
--   state being what the fallback continues from, and only that:
--   token bucket {tokens}, GCRA {tat, tat_rem}, sliding window counter
--   {window_start, current, previous}, sliding window log {age1..age8};
--   then, on a refusal only, possibly {resend_id, resend_until_us}
--   (resend_hint).
-- The decision being made: set by args from its key and arguments (one
-- script call, or one request of a batch, lua/batch.lua), read by the
-- helpers below and the algorithm.
local limit, window, cost, capacity, wnum, wden, elimit, key, resend_arg, req_id, hold
-- A number argument costs a string conversion (tonumber): the ones that
-- are mostly their default are compared as strings first.
local function args(k, a)
  limit, window, cost = tonumber(a[2]), tonumber(a[3]), tonumber(a[5])
  capacity = tonumber(a[4])
  if a[7] == '1' and a[8] == '1' then
    wnum, wden, elimit = 1, 1, limit
  else
    wnum, wden = tonumber(a[7]) or 1, tonumber(a[8]) or 1
    if wnum < 1 then wnum, wden = 1, 1 end
    -- ratelimit.Weight: cost × num/den, and limit × den/num.
    elimit = fdiv(limit * wden, wnum)
  end
  key = k
  req_id = a[6] or ''
  resend_arg = a[9]
  hold = 0
  if a[10] and a[10] ~= '0' then hold = tonumber(a[10]) or 0 end
end
local function wscale(x)
  if wnum == wden and x >= 0 then return x end
  return cdiv(x * wnum, wden)
end
local function wunits(room, unit)
  if room <= 0 then return 0 end
  return fdiv(room, wscale(unit))
end

-- The resend window in µs (ARGV[9]), read only by the decisions that need
-- it: a resend, or an admission to keep or hint at.
local function resend_us() return tonumber(resend_arg) or 3000000 end

-- Whether a request at now is within the resend window of an admission at
-- at (either side: a clock that stepped back less than the window still
-- recognises a resend). Twin of algorithm.Admission.Resend.
local function resent(at, now)
  return math.abs(now - at) < resend_us()
end

-- Appends to the reply r of a refusal the key's last admission (request id,
-- and the Redis time in µs until which a request with that id is taken for
-- a resend of it and admitted) while that time is ahead: a cache of this
-- refusal must not answer that request (ratelimit.Decision.ResendID).
local function resend_hint(r, id, at, now)
  if id ~= '' and resent(at, now) then
    r[#r + 1] = id
    r[#r + 1] = at + resend_us()
  end
end
