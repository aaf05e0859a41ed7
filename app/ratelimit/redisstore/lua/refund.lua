-- Refund one admission: undo what a decision script counted for a request
-- whose caller was answered otherwise (the store admitted it after the
-- caller's deadline, and the caller refused it locally: see the resilient
-- limiter's late replies). Sent once per such request, never again: a
-- refund that timed out may or may not have been applied, and a second one
-- would undo usage that is real.
-- KEYS: [1] the key's state
-- ARGV: [1] now override  [2] algorithm ('tb', 'gcra', 'swc', 'swl')
--       [3] limit  [4] window µs  [5] capacity  [6] cost  [7] request id
--       [8], [9] weight num, den (the request's: what the admission charged)
--       [10] the admission's Redis time, µs (the counter's window)
-- Reply: the units given back (0: nothing left to give back, the state having
-- refilled, aged or expired past the admission).
local now = now_us()
local key, alg = KEYS[1], ARGV[2]
local limit, window, capacity = num(ARGV[3], 'limit'), num(ARGV[4], 'window'), num(ARGV[5], 'capacity')
local cost, id = num(ARGV[6], 'cost'), ARGV[7]
local wnum, wden = num(ARGV[8], 'weight'), num(ARGV[9], 'weight')
if wnum < 1 then wnum, wden = 1, 1 end
local at = num(ARGV[10], 'admission time')
local charged = cdiv(cost * window * wnum, wden)

-- The request's units in back, a part of charged (weighted, × window).
local function units(back)
  if back >= charged then return cost end
  return fdiv(back * wden, wnum * window)
end

-- Whether an admission (lua/once.lua) names this request: a resend must
-- then be decided afresh, as the refund undid the admission.
local function names_request(adm)
  return adm and string.sub(adm, -(string.len(id) + 1)) == ':' .. id
end

-- The window counter's admission field names this request: it goes.
local function forget_admission()
  if names_request(redis.call('HGET', key, 'i')) then redis.call('HDEL', key, 'i') end
end

-- Writes the state of the token bucket or GCRA (lua/state.lua) without
-- the key's admission adm if it names this request.
local function put_forgetting(adm, a, b, ttl)
  if names_request(adm) then adm = nil end
  pair_put(key, a, b, adm, ttl)
end

if alg == 'tb' then
  local cap = capacity * window
  local t0, l0, adm = pair_get(key)
  if not l0 then return 0 end
  local last = num(l0, 'l')
  local tokens = refill(num(t0, 't'), last, now, cap, limit)
  local back = math.min(charged, cap - tokens)
  if back <= 0 then return 0 end
  tokens = tokens + back
  put_forgetting(adm, tokens, math.max(now, last), cdiv(cdiv(cap - tokens, limit), 1000) + margin_ms)
  return units(back)
end

if alg == 'gcra' then
  local t0, r0, adm = pair_get(key)
  if not t0 then return 0 end
  local tat, rem = num(t0, 't'), num(r0, 'r')
  local ahead = (tat - now) * limit + rem
  if ahead <= 0 then return 0 end
  local back = math.min(charged, ahead)
  ahead = ahead - back
  tat = now + fdiv(ahead, limit)
  rem = ahead - (tat - now) * limit
  put_forgetting(adm, tat, rem, cdiv(cdiv(ahead, limit), 1000) + margin_ms)
  return units(back)
end

if alg == 'swc' then
  local start = now - (now % window)
  local ws = at - (at % window)
  local field
  if ws == start then
    field = 'c'
  elseif ws == start - window then
    field = 'p'
  else
    return 0
  end
  local cur, prev = counter_state(key, start, window)
  local n = cur
  if field == 'p' then n = prev end
  local back = math.min(cost, n)
  if back <= 0 then return 0 end
  if field == 'c' then cur = cur - back else prev = prev - back end
  redis.call('HSET', key, 'w', str(start), 'c', str(cur), 'p', str(prev))
  forget_admission()
  return back
end

if alg == 'swl' then
  local members = {id}
  for u = 2, cost do members[#members + 1] = id .. '#' .. u end
  local back = 0
  for i = 1, #members, 1000 do
    back = back + redis.call('ZREM', key, unpack(members, i, math.min(i + 999, #members)))
  end
  return back
end

error('fleetlimit: unknown algorithm ' .. alg)
