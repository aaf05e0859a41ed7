-- Helpers of the replay and repair scripts (after arith.lua, fill.lua and
-- counter.lua).

-- A sliding window log key that got entries up to newest lives until its
-- newest entry (newest, or a later one already there) leaves the window.
local function expire_log(key, newest, window, now)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local top = math.max(newest, num(last[2], 'score'))
  redis.call('PEXPIRE', key, cdiv(top + window - now, 1000) + margin_ms)
end

-- Replay markers kept in the window counter's own hash: field mfield
-- ("m:<instance>") lists the last few markers
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
