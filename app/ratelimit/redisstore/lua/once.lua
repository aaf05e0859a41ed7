-- At most once per request id, for the algorithms whose state is a hash
-- (the sliding window log's members are request ids already). nginx resends
-- a request to another instance when the first one failed or timed out,
-- possibly after deciding it; the resend carries the same X-Request-Id. The
-- hash keeps the id of the last request it admitted (field i): a request
-- with that id is answered as admitted, with the state as it is, and is not
-- counted again. Only the last admitted id is kept: a resend that arrives
-- after another request of the same key was admitted counts again.
local req_id = ARGV[6] or ''
local again = req_id ~= '' and redis.call('HGET', key, 'i') == req_id
if again then cost = 0 end
local decided = reply
reply = function(allowed, remaining, reset, retry, ...)
  if again then return decided(1, remaining, reset, 0, ...) end
  if allowed == 1 and req_id ~= '' then
    -- The algorithm wrote the hash (and its TTL) for an admission.
    redis.call('HSET', key, 'i', req_id)
  end
  return decided(allowed, remaining, reset, retry, ...)
end
