-- Sliding window log replay of one key. Twin of ratelimit.WindowLogReplay:
-- each grant is added with its own time and request id; a member already
-- present (the same request decided in Redis by a call that timed out but
-- still ran) is not added again and counts as present.
local function fold(key, limit, window, capacity, now, grants, m)
  -- The log's members are request ids: its marker is a key of its own.
  if not redis.call('SET', m.key, '1', 'PX', m.ttl, 'NX') then return 0, 0, 0, 1 end
  local cutoff = now - window
  redis.call('ZREMRANGEBYSCORE', key, '-inf', str(cutoff))
  local replayed, dropped, present = 0, 0, 0
  local newest = nil
  for _, g in ipairs(grants) do
    if g.at <= cutoff then
      dropped = dropped + g.cost
    else
      for i = 1, g.cost do
        local member = g.id
        if i > 1 then member = g.id .. '#' .. i end
        if redis.call('ZADD', key, 'NX', str(g.at), member) == 1 then
          replayed = replayed + 1
        else
          present = present + 1
        end
      end
      newest = math.max(newest or g.at, g.at)
    end
  end
  if newest then
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    local top = math.max(newest, num(last[2], 'score'))
    redis.call('PEXPIRE', key, cdiv(top + window - now, 1000) + margin_ms)
  end
  return replayed, dropped, present, 0
end
