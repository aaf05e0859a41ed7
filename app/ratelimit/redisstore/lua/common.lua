-- Helpers shared by every script. ARGV[1] is always the time override in µs
-- (0: take the time from redis TIME, the production path).
-- All arithmetic stays integral and below 2^53, so float64 Lua agrees with
-- the Go twins (package ratelimit) to the bit.
-- Keys outlive the time their state matters by this much (ms).
local margin_ms = 1000

local function now_us()
  local n = tonumber(ARGV[1])
  if n and n > 0 then return n end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- floor(a / b) for a >= 0, b > 0, exact despite float division.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 end
  if (q + 1) * b <= a then q = q + 1 end
  return q
end

-- ceil(a / b) for b > 0; 0 when a <= 0.
local function cdiv(a, b)
  if a <= 0 then return 0 end
  return fdiv(a + b - 1, b)
end

-- The token bucket's tokens at time at, from t0 at last: refilled at limit
-- per µs, capped at cap. Shared by the decision and the replay (twin of
-- ratelimit.tokenBucketFill).
local function refill(t0, last, at, cap, limit)
  local elapsed = at - last
  if elapsed <= 0 then return math.min(t0, cap) end
  if t0 >= cap or elapsed >= cdiv(cap - t0, limit) then return cap end
  return t0 + elapsed * limit
end

-- Integers as exact decimal strings (redis would format numbers with %.17g).
local function str(x) return string.format('%.0f', x) end

local function num(v, what)
  local n = tonumber(v)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then error('fleetlimit: corrupt state (' .. what .. ')') end
  return n
end

-- A sliding window log key that got entries up to newest lives until its
-- newest entry (newest, or a later one already there) leaves the window.
local function expire_log(key, newest, window, now)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local top = math.max(newest, num(last[2], 'score'))
  redis.call('PEXPIRE', key, cdiv(top + window - now, 1000) + margin_ms)
end

-- The sliding window counter's counts of the window at start and the one
-- before, from its hash {w, c, p} moved forward (ratelimit.WindowCounterState.Shift),
-- and the hash's field i (lua/once.lua), read in the same command.
local function counter_state(key, start, window)
  local st = redis.call('HMGET', key, 'w', 'c', 'p', 'i')
  if not st[1] then return 0, 0, st[4] end
  local ws = num(st[1], 'w')
  if ws == start then return num(st[2], 'c'), num(st[3], 'p'), st[4] end
  if ws == start - window then return 0, num(st[2], 'c'), st[4] end
  return 0, 0, st[4]
end


-- Replay markers kept in a key's own hash (the token bucket's, GCRA's and
-- the counter's): field mfield ("m:<instance>") lists the last few markers
-- (epochs) of that instance's batches applied to the key, so a batch sent
-- again is recognised without a marker key of its own. The list dies with
-- the key, when its usage no longer matters.
local function marked(list, token)
  return list ~= nil and list ~= false and string.find(' ' .. list .. ' ', ' ' .. token .. ' ', 1, true) ~= nil
end

local function mark(list, token)
  if list == nil or list == false or list == '' then return token end
  local kept = {}
  for t in string.gmatch(list, '%S+') do kept[#kept + 1] = t end
  while #kept >= 8 do table.remove(kept, 1) end
  kept[#kept + 1] = token
  return table.concat(kept, ' ')
end
