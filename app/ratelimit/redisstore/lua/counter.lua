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
