-- The batch decision script: decides #KEYS requests in order, in one call,
-- each as its algorithm's decision script would alone (the algorithms are
-- the functions decide_1..decide_4 before this, lua/*.lua wrapped in Go:
-- redisstore.batchSrc). One TIME serves the whole batch: its decisions are
-- made at the same instant, which one atomic script may do.
-- KEYS[i]: request i's key (on a Cluster, all of one hash slot).
-- ARGV: [1] now override  [2] resend window in µs (lua/once.lua)
--       then 9 per request, from 3 + 9 × (i - 1): algorithm (1 token
--       bucket, 2 GCRA, 3 sliding window counter, 4 sliding window log),
--       then the decision script's ARGV[2..8] and ARGV[10] (the hold,
--       lua/decide.lua).
-- Reply: one element per request: its decision script's reply, or the
--   error that script would have failed with (a corrupt key fails its own
--   request only).
local batch_now = now_us()
now_us = function() return batch_now end
local algorithms = {decide_1, decide_2, decide_3, decide_4}
local a = {ARGV[1], 0, 0, 0, 0, '', 1, 1, ARGV[2], 0}
local out = {}
for i = 1, #KEYS do
  local b = 3 + 9 * (i - 1)
  for j = 2, 8 do a[j] = ARGV[b + j - 1] end
  a[10] = ARGV[b + 8]
  args(KEYS[i], a)
  local fn = algorithms[tonumber(ARGV[b])]
  local ok, r
  if fn then
    ok, r = pcall(fn)
  else
    ok, r = false, 'fleetlimit: unknown algorithm ' .. tostring(ARGV[b])
  end
  if ok then
    out[i] = r
  elseif type(r) == 'table' and r.err then
    out[i] = {err = r.err}
  elseif type(r) == 'string' and string.find(r, '^%u+ ') then
    out[i] = {err = r} -- a command's refusal (OOM, READONLY...), as is
  else
    out[i] = {err = 'ERR ' .. tostring(r)}
  end
end
return out
