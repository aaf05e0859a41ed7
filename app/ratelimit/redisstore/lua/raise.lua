-- Raise one key to a floor: the usage a reply showed an instance, which a
-- Redis that lost acknowledged writes (a replica promoted while behind, an
-- AOF that lost its last second) no longer holds. A max-merge, not an
-- addition: the key ends up holding at least the floor's usage and keeps
-- whatever it holds beyond it, so the part of the floor that did reach the
-- replica is not counted twice, and raising a key again, or to another
-- instance's floor, changes nothing that is already there. Needs no marker.
-- KEYS: [1] the key's state
-- ARGV: [1] now override  [2] algorithm ('tb', 'gcra', 'swc', 'swl')
--       [3] limit  [4] window µs  [5] capacity, then the floor:
--       tb: tokens (× window), its time
--       gcra: TAT µs, TAT remainder
--       swc: window start, current count, previous count
--       swl: its time, the 8 age buckets' counts, a member id prefix
-- Reply: the units put back (0 if the key already held the floor).
local now = now_us()
local key, alg = KEYS[1], ARGV[2]
local limit, window, capacity = num(ARGV[3], 'limit'), num(ARGV[4], 'window'), num(ARGV[5], 'capacity')

if alg == 'tb' then
  local cap = capacity * window
  local floor = refill(num(ARGV[6], 'tokens'), math.min(num(ARGV[7], 'time'), now), now, cap, limit)
  local t0, l0, adm = pair_get(key)
  local cur, last = cap, now
  if l0 then
    last = num(l0, 'l')
    cur = refill(num(t0, 't'), last, now, cap, limit)
  end
  if floor >= cur then return 0 end
  last = math.max(now, last)
  pair_put(key, floor, last, adm, cdiv(last + cdiv(cap - floor, limit) - now, 1000) + margin_ms)
  return cdiv(cur - floor, window)
end

if alg == 'gcra' then
  local tat, rem = num(ARGV[6], 'tat'), num(ARGV[7], 'rem')
  if tat <= now then return 0 end
  local t0, r0, last = pair_get(key)
  local ctat, crem = now, 0
  if t0 then
    ctat, crem = num(t0, 't'), num(r0, 'r')
    if ctat < now then ctat, crem = now, 0 end
  end
  if tat < ctat or (tat == ctat and rem <= crem) then return 0 end
  pair_put(key, tat, rem, last, cdiv(tat - now + 1, 1000) + margin_ms)
  return cdiv((tat - ctat) * limit + rem - crem, window)
end

if alg == 'swc' then
  local start = now - (now % window)
  local ws, c, p = num(ARGV[6], 'window start'), num(ARGV[7], 'current'), num(ARGV[8], 'previous')
  local fc, fp = 0, 0
  if ws == start then
    fc, fp = c, p
  elseif ws == start - window then
    fp = c
  end
  local cur, prev = counter_state(key, start, window)
  if fc <= cur and fp <= prev then return 0 end
  redis.call('HSET', key, 'w', str(start), 'c', str(math.max(fc, cur)), 'p', str(math.max(fp, prev)))
  redis.call('PEXPIRE', key, cdiv(2 * window - (now - start), 1000) + margin_ms)
  return math.max(0, fc - cur) + math.max(0, fp - prev)
end

if alg == 'swl' then
  -- At the floor's time, bucket i held the grants between i and i+1
  -- eighths of a window old. Counted from the newest, the key must hold at
  -- least as many grants newer than each bucket's oldest edge as the floor
  -- did (cumulative, so that grants another instance's raise added, at a
  -- slightly different time, count for this one too); the missing ones are
  -- added at the bucket's newest time, so they expire no earlier than the
  -- lost ones did.
  local at = math.min(num(ARGV[6], 'time'), now)
  local prefix = ARGV[15]
  local cutoff = now - window
  redis.call('ZREMRANGEBYSCORE', key, '-inf', str(cutoff))
  local added, newest, want = 0, nil, 0
  for i = 0, 7 do
    want = want + num(ARGV[7 + i], 'age bucket')
    local hi = at - fdiv(i * window, 8)
    local lo = at - fdiv((i + 1) * window, 8)
    if want > 0 and hi > cutoff then
      local have = redis.call('ZCOUNT', key, '(' .. str(lo), '+inf')
      local k = have
      while k < want do
        local batch = {}
        for j = k + 1, math.min(want, k + 500) do
          batch[#batch + 1] = str(hi)
          batch[#batch + 1] = prefix .. j
        end
        added = added + redis.call('ZADD', key, 'NX', unpack(batch))
        k = math.min(want, k + 500)
      end
      if want > have then newest = math.max(newest or hi, hi) end
    end
  end
  if newest then expire_log(key, newest, window, now) end
  return added
end

error('fleetlimit: unknown algorithm ' .. tostring(alg))
