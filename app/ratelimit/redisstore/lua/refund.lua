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
--       [11] '1': GCRA's state as a hash (lua/gcra_state.lua)
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

-- The admission field of a hash (lua/once.lua) names this request: a resend
-- must be decided afresh, as the refund undid the admission.
local function forget_admission()
  local last = redis.call('HGET', key, 'i')
  if last and string.sub(last, -(string.len(id) + 1)) == ':' .. id then
    redis.call('HDEL', key, 'i')
  end
end

if alg == 'tb' then
  local cap = capacity * window
  local st = redis.call('HMGET', key, 't', 'l')
  if not st[2] then return 0 end
  local last = num(st[2], 'l')
  local tokens = refill(num(st[1], 't'), last, now, cap, limit)
  local back = math.min(charged, cap - tokens)
  if back <= 0 then return 0 end
  tokens = tokens + back
  redis.call('HSET', key, 't', str(tokens), 'l', str(math.max(now, last)))
  forget_admission()
  redis.call('PEXPIRE', key, cdiv(cdiv(cap - tokens, limit), 1000) + margin_ms)
  return units(back)
end

if alg == 'gcra' then
  local t0, r0, last = gcra_get(key)
  if not t0 then return 0 end
  local tat, rem = num(t0, 't'), num(r0, 'r')
  local ahead = (tat - now) * limit + rem
  if ahead <= 0 then return 0 end
  local back = math.min(charged, ahead)
  ahead = ahead - back
  tat = now + fdiv(ahead, limit)
  rem = ahead - (tat - now) * limit
  -- The admission is this request's: forgotten (see forget_admission).
  local forget = last and string.sub(last, -(string.len(id) + 1)) == ':' .. id
  if forget then last = nil end
  local hash = ARGV[11] == '1'
  gcra_put(key, tat, rem, last, cdiv(cdiv(ahead, limit), 1000) + margin_ms, hash)
  if forget and hash then redis.call('HDEL', key, 'i') end
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
