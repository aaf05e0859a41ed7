-- At most once per request id, for the token bucket, GCRA and the window
-- counter (the sliding window log keeps request ids as its members). A
-- proxy resends a request to another instance when the first one failed or
-- timed out, possibly after deciding it; the resend carries the same
-- X-Request-Id. The key's state keeps its last admission (the counter's
-- hash in field i, the others' string after its two integers:
-- lua/state.lua), as "<µs>:<id>" (Redis time of the admission, request
-- id; twin: algorithm.Admission), read and written with the state, so the
-- check costs no command of its own. A request with that id less than ARGV[9] µs (the
-- resend window) from that admission is answered as admitted, with the
-- state as it is, and is not counted again (seen: its cost is 0, and the
-- algorithm's answer is made an admission). Later than that, or once
-- another request of the key was admitted, the same id counts like any
-- other: an id repeated on purpose buys nothing beyond the window. The
-- request id is req_id (lua/decide.lua).

-- The admission the state records (last): its time and id, or nil.
local function admission(last)
  if not last then return nil end
  local sep = string.find(last, ':', 1, true)
  if not sep then return nil end
  local at = tonumber(string.sub(last, 1, sep - 1))
  if not at then return nil end
  return at, string.sub(last, sep + 1)
end

-- Whether the recorded admission (last) is this request's id within the
-- resend window of now. Most requests are not resends: a last that does
-- not end with the id is told apart without parsing it.
local function seen(last, now)
  if req_id == '' or not last or string.sub(last, -#req_id) ~= req_id then return false end
  local at, id = admission(last)
  return at ~= nil and id == req_id and resent(at, now)
end

-- The reply r of a refusal, with the admission the state records when a
-- resend of it would still be recognised (see resend_hint).
local function refusal_hint(r, last, now)
  local at, id = admission(last)
  if at then resend_hint(r, id, at, now) end
  return r
end

-- Writes the state of the token bucket or GCRA (lua/state.lua) after an
-- admission at now: a and b, with this request's admission, unless it is
-- a resend (again), else the key's last (last) while a resend of it is
-- still recognised.
local function put_admitted(a, b, again, last, now, ttl)
  if not again and req_id ~= '' then
    redis.call('SET', key, string.format('%.0f:%.0f:%.0f:', a, b, now) .. req_id, 'PX', ttl)
    return
  end
  local at = admission(last)
  if at and resent(at, now) then pair_put(key, a, b, last, ttl) else pair_put(key, a, b, nil, ttl) end
end
