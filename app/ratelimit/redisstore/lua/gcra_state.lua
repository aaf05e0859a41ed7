-- GCRA's state in Redis: one string, "<tat>:<rem>" (the theoretical
-- arrival time in µs and its remainder in 1/limit µs), followed by
-- ":<admission>" (lua/once.lua: "<µs>:<id>") while the key's last admission
-- is within the resend window, written with SET ... PX: two commands a
-- decision. Releases before kept a hash {t, r, i, m:<instance>...}: every
-- script reads both, and writes the hash when told to (hash:
-- redisstore.WithGCRAHashes, for a fleet part of which still runs such a
-- release, which cannot read the string).

-- Key's state: tat, rem and the admission (strings or nil; no tat: no
-- state), and for a hash the replay markers in field mfield (lua/common.lua).
local function gcra_get(key, mfield)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then -- WRONGTYPE: an earlier release's hash
    local st = redis.call('HMGET', key, 't', 'r', 'i', mfield or 'i')
    return st[1], st[2], st[3], st[4]
  end
  if not v then return nil end
  local a = string.find(v, ':', 1, true)
  if not a then return v, nil end -- corrupt: the caller's num() names it
  local b = string.find(v, ':', a + 1, true)
  if not b then return string.sub(v, 1, a - 1), string.sub(v, a + 1) end
  return string.sub(v, 1, a - 1), string.sub(v, a + 1, b - 1), string.sub(v, b + 1)
end

-- Writes key's state, to live ttl ms; adm: the admission to keep, or nil;
-- hash: as a hash.
local function gcra_put(key, tat, rem, adm, ttl, hash)
  if hash then
    local fields = {'t', str(tat), 'r', str(rem)}
    if adm then fields[5], fields[6] = 'i', adm end
    if type(redis.pcall('HSET', key, unpack(fields))) == 'table' then
      -- The string of a later release: this one's hash replaces it.
      redis.call('DEL', key)
      redis.call('HSET', key, unpack(fields))
    end
    redis.call('PEXPIRE', key, ttl)
  elseif adm then
    redis.call('SET', key, str(tat) .. ':' .. str(rem) .. ':' .. adm, 'PX', ttl)
  else
    redis.call('SET', key, str(tat) .. ':' .. str(rem), 'PX', ttl)
  end
end
