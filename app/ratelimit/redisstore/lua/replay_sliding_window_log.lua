-- Sliding window log replay of one key. Twin of algorithm.WindowLogReplay:
-- each grant is added with its own time and request id; a member already
-- present (the same request decided in Redis by a call that timed out but
-- still ran) is not added again and counts as present.
local function fold(key, limit, window, capacity, now, n, at, cost, id, mfield, mtoken, mkey, ttl)
  -- The log's members are request ids: its marker is a key of its own.
  if not redis.call('SET', mkey, '1', 'PX', ttl, 'NX') then return 0, 0, 0, 1 end
  local cutoff = now - window
  redis.call('ZREMRANGEBYSCORE', key, '-inf', str(cutoff))
  local replayed, dropped, present = 0, 0, 0
  local newest = nil
  for i = 1, n do
    if at[i] <= cutoff then
      dropped = dropped + cost[i]
    else
      for u = 1, cost[i] do
        local member = id[i]
        if u > 1 then member = id[i] .. '#' .. u end
        if redis.call('ZADD', key, 'NX', str(at[i]), member) == 1 then
          replayed = replayed + 1
        else
          present = present + 1
        end
      end
      newest = math.max(newest or at[i], at[i])
    end
  end
  if newest then expire_log(key, newest, window, now) end
  return replayed, dropped, present, 0
end
