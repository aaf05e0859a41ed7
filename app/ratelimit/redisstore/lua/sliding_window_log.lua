-- Sliding window log. KEYS[1]: sorted set, one member per granted unit: the
-- request id (suffixed #2, #3... for a cost above 1), scored by its grant
-- time in µs. ARGV[6]: the request id.
-- Twin of algorithm.WindowLogDecide. A request id already in the set was
-- counted before (a decision that timed out but ran, a replay): it is
-- answered as allowed and not counted again.
local now = now_us()
local limit = elimit
local id = ARGV[6]
redis.call('ZREMRANGEBYSCORE', key, '-inf', str(now - window))
local count = redis.call('ZCARD', key)
local allowed, retry = 0, 0
if redis.call('ZSCORE', key, id) then
  allowed = 1
elseif count + cost <= limit then
  allowed = 1
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
      args[#args + 1] = id .. '#' .. i
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
if count > 0 then
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  reset = math.max(0, num(newest[2], 'score') + window - now)
  local hi = now
  for i = 1, 8 do
    local lo = now - fdiv(i * window, 8)
    if i == 8 then lo = now - window end
    ages[i] = redis.call('ZCOUNT', key, '(' .. str(lo), str(hi))
    hi = lo
  end
  redis.call('PEXPIRE', key, cdiv(reset, 1000) + margin_ms)
end
return reply(allowed, math.max(0, limit - count), reset, retry, now, unpack(ages))
