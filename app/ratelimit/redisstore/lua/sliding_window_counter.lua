-- Sliding window counter. KEYS[1]: hash {w = window start µs, c = count of
-- that window, p = count of the window before}.
-- Twin of algorithm.WindowCounterDecide.
local now = now_us()
local limit = elimit
local start = now - (now % window)
local cur, prev, last = counter_state(key, start, window)
local again = seen(last, now)
if again then cost = 0 end
local elapsed = now - start
local used = prev * (window - elapsed) + cur * window
local allowed, retry = 0, 0
if used + cost * window <= limit * window then
  allowed = 1
  cur = cur + cost
  used = used + cost * window
else
  local found = cost > limit
  if found then retry = window end
  local room = (limit - cost - cur) * window
  if not found and room >= 0 and prev > 0 then
    local at = window - fdiv(room, prev)
    if at < window then
      retry = at - elapsed
      found = true
    end
  end
  if not found then
    local at = 0
    if cur > 0 then at = math.max(0, window - fdiv((limit - cost) * window, cur)) end
    retry = window - elapsed + at
  end
end
local remaining = 0
if limit * window - used > 0 then remaining = fdiv(limit * window - used, window) end
local reset = 0
if cur > 0 then
  reset = 2 * window - elapsed
elseif prev > 0 then
  reset = window - elapsed
end
if reset > 0 then
  -- With this request's admission (lua/once.lua) when it is admitted now.
  if allowed == 1 and not again and req_id ~= '' then
    redis.call('HSET', key, 'i', str(now) .. ':' .. req_id, 'w', str(start), 'c', str(cur), 'p', str(prev))
  else
    redis.call('HSET', key, 'w', str(start), 'c', str(cur), 'p', str(prev))
  end
  redis.call('PEXPIRE', key, cdiv(reset, 1000) + margin_ms)
end
if again then allowed, retry = 1, 0 end
local r = {allowed, remaining, reset, retry, now, start, cur, prev}
if allowed == 0 then refusal_hint(r, last, now) end
return r
