-- The state of the token bucket and GCRA in Redis: one string of two
-- integers and the key's last admission, "<a>:<b>" or "<a>:<b>:<µs>:<id>"
-- (lua/once.lua: kept while a resend of it is recognised), written with
-- SET ... PX: two commands a decision. Token bucket: a = tokens × window
-- µs, b = the last update in µs; GCRA: a = the theoretical arrival time in
-- µs, b = its remainder in 1/limit µs.

-- Key's state: a, b and the admission (strings or nil; no a: no state).
local function pair_get(key)
  local v = redis.call('GET', key)
  if not v then return nil end
  local i = string.find(v, ':', 1, true)
  if not i then return v, nil end -- corrupt: the caller's num() names it
  local j = string.find(v, ':', i + 1, true)
  if not j then return string.sub(v, 1, i - 1), string.sub(v, i + 1) end
  return string.sub(v, 1, i - 1), string.sub(v, i + 1, j - 1), string.sub(v, j + 1)
end

-- Writes key's state a, b (numbers), to live ttl ms; adm: the admission to
-- keep, or nil.
local function pair_put(key, a, b, adm, ttl)
  if adm then
    redis.call('SET', key, string.format('%.0f:%.0f:', a, b) .. adm, 'PX', ttl)
  else
    redis.call('SET', key, string.format('%.0f:%.0f', a, b), 'PX', ttl)
  end
end
