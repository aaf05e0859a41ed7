-- The token bucket's tokens at time at, from t0 at last: refilled at limit
-- per µs, capped at cap. Shared by the decision, the replay and the repair (twin of
-- ratelimit.tokenBucketFill).
local function refill(t0, last, at, cap, limit)
  local elapsed = at - last
  if elapsed <= 0 then return math.min(t0, cap) end
  if t0 >= cap or elapsed >= cdiv(cap - t0, limit) then return cap end
  return t0 + elapsed * limit
end
