-- The state of the token bucket and GCRA in Redis: one string of two
-- integers and the key's last admission, "<a>:<b>" or "<a>:<b>:<µs>:<id>"
-- (lua/once.lua: kept while a resend of it is recognised), written with
-- SET ... PX: two commands a decision. Token bucket: a = tokens × window
-- µs, b = the last update in µs; GCRA: a = the theoretical arrival time in
-- µs, b = its remainder in 1/limit µs. Releases before kept a hash of
-- fields (token bucket {t, l, i}, GCRA {t, r, i}, and the replay markers
-- m:<instance>): every script reads both, and writes the hash when told to
-- (hash: redisstore.WithHashState, for a fleet part of which still runs
-- such a release, which cannot read the string).

-- Key's state: a, b and the admission (strings or nil; no a: no state),
-- and for a hash, the replay markers in field mfield (lua/common.lua). fa
-- and fb name a and b in a hash.
local function pair_get(key, fa, fb, mfield)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then -- WRONGTYPE: an earlier release's hash
    local st = redis.call('HMGET', key, fa, fb, 'i', mfield or 'i')
    return st[1], st[2], st[3], st[4]
  end
  if not v then return nil end
  local i = string.find(v, ':', 1, true)
  if not i then return v, nil end -- corrupt: the caller's num() names it
  local j = string.find(v, ':', i + 1, true)
  if not j then return string.sub(v, 1, i - 1), string.sub(v, i + 1) end
  return string.sub(v, 1, i - 1), string.sub(v, i + 1, j - 1), string.sub(v, j + 1)
end

-- Writes key's state a, b (numbers), to live ttl ms; adm: the admission to
-- keep, or nil; hash: as a hash, a and b in fields fa and fb.
local function pair_put(key, fa, a, fb, b, adm, ttl, hash)
  if hash then
    local fields = {fa, str(a), fb, str(b)}
    if adm then fields[5], fields[6] = 'i', adm end
    if type(redis.pcall('HSET', key, unpack(fields))) == 'table' then
      -- The string of a later release: this one's hash replaces it.
      redis.call('DEL', key)
      redis.call('HSET', key, unpack(fields))
    end
    redis.call('PEXPIRE', key, ttl)
  elseif adm then
    redis.call('SET', key, str(a) .. ':' .. str(b) .. ':' .. adm, 'PX', ttl)
  else
    redis.call('SET', key, str(a) .. ':' .. str(b), 'PX', ttl)
  end
end
