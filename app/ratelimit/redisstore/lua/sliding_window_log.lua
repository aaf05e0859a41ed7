-- Sliding window log. KEYS[1]: sorted set, one member per granted unit: the
-- request id (suffixed #2, #3... for a cost above 1), scored by its grant
-- time in µs. req_id (ARGV[6], lua/decide.lua): the request id.
-- Twin of algorithm.WindowLogDecide. A request whose id is in the set,
-- admitted less than the resend window (ARGV[9], lua/once.lua) from now, was
-- counted before (a resend, a decision that timed out but ran): it is
-- answered as allowed and not counted again. An id admitted longer ago
-- counts again: its earlier grant keeps its place under a name of its own
-- (id#@<its time>) and the new one takes the id, so that the member named
-- by the id is always the id's latest admission (what a resend, and a
-- replay of the same request, are checked against). The new grant's extra
-- units are id#<n>@<now>, apart from the earlier grant's id#<n>.
local now = now_us()
local limit = elimit
local id = req_id
redis.call('ZREMRANGEBYSCORE', key, '-inf', str(now - window))
local count = redis.call('ZCARD', key)
local allowed, retry = 0, 0
local prior = redis.call('ZSCORE', key, id)
if prior then prior = num(prior, 'score') end
if prior and resent(prior, now) then
  allowed = 1
elseif count + cost <= limit then
  allowed = 1
  local extra = ''
  if prior then
    local moved = id .. '#@' .. str(prior)
    local n = 1
    while redis.call('ZSCORE', key, moved) do
      n = n + 1
      moved = id .. '#@' .. str(prior) .. '.' .. n
    end
    redis.call('ZADD', key, str(prior), moved)
    extra = '@' .. str(now)
  end
  -- ZADD in chunks: unpack of more than a few thousand values overflows
  -- Lua 5.1's C stack ("too many results to unpack"). A read-only request
  -- (cost 0) adds nothing.
  if cost > 0 then
    local args = {str(now), id}
    for i = 2, cost do
      if #args >= 1000 then
        redis.call('ZADD', key, unpack(args))
        args = {}
      end
      args[#args + 1] = str(now)
      args[#args + 1] = id .. '#' .. i .. extra
    end
    redis.call('ZADD', key, unpack(args))
  end
  count = count + cost
elseif cost > limit then
  retry = window
else
  local nth = redis.call('ZRANGE', key, count + cost - limit - 1, count + cost - limit - 1, 'WITHSCORES')
  retry = num(nth[2], 'score') + window - now
end
local reset = 0
local ages = {0, 0, 0, 0, 0, 0, 0, 0}
local last, last_at = nil, 0 -- the newest grant's request id and time
if count > 0 then
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  last_at = num(newest[2], 'score')
  last = string.match(newest[1], '^[^#]*')
  reset = math.max(0, last_at + window - now)
  local hi = now
  for i = 1, 8 do
    local lo = now - fdiv(i * window, 8)
    if i == 8 then lo = now - window end
    ages[i] = redis.call('ZCOUNT', key, '(' .. str(lo), str(hi))
    hi = lo
  end
  redis.call('PEXPIRE', key, cdiv(reset, 1000) + margin_ms)
end
local r = {allowed, math.max(0, limit - count), reset, retry, now, unpack(ages)}
if allowed == 0 and last then resend_hint(r, last, last_at, now) end
return r
