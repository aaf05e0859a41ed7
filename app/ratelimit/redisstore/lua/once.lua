-- At most once per request id, for the algorithms whose state is a hash
-- (the sliding window log's members are request ids already). nginx resends
-- a request to another instance when the first one failed or timed out,
-- possibly after deciding it; the resend carries the same X-Request-Id. The
-- hash keeps the id of the last request it admitted (field i), read with
-- the state and written with it, so that the check costs no command of its
-- own: a request with that id is answered as admitted, with the state as it
-- is, and is not counted again (seen: its cost is 0, and the algorithm's
-- answer is made an admission). Only the last admitted id is kept: a resend
-- that arrives after another request of the same key was admitted counts
-- again.
local req_id = ARGV[6] or ''

-- Whether last (the hash's field i) is this request's id.
local function seen(last)
  return req_id ~= '' and last == req_id
end

-- Writes the state's fields (name, value, ...) to the key's hash, and this
-- request's id with them when it is admitted now (allowed, not seen before).
local function save(allowed, again, ...)
  if allowed == 1 and not again and req_id ~= '' then
    redis.call('HSET', key, 'i', req_id, ...)
  else
    redis.call('HSET', key, ...)
  end
end
