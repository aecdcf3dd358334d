-- The health sampler election of one metric set of one database.
-- KEYS[1] the lease (a string: the holder's instance id), KEYS[2] the sample (a hash: at, its
-- date, the Redis time in µs of the holder's election round before it read the sample; data,
-- what the holder published; sig, the holder's signature of both, which the script does not
-- read: the followers check it).
-- ARGV[1] the op: elect, publish or resign; ARGV[2] the instance; ARGV[3] the lease in ms;
-- ARGV[4] the sample's lifetime in ms; ARGV[5] (elect) the largest sample in bytes, or
-- (publish) the sample, with ARGV[6] its date and ARGV[7] its signature.
-- Redis is not trusted to hold only what this script wrote: a lease of another type or with
-- no expiry (or one longer than ours) is taken over; a sample of another type or too large is
-- reported, never returned.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local op, me, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])

local function holder()
  if redis.call('TYPE', KEYS[1]).ok ~= 'string' then
    return false
  end
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 or ttl > lease then
    return false -- no expiry, or longer than any lease we give: not ours
  end
  return redis.call('GET', KEYS[1])
end

if op == 'resign' then
  if holder() == me then
    redis.call('DEL', KEYS[1])
  end
  return {now, 'ok'}
end

local h = holder()
if op == 'publish' then
  if h ~= me then
    return {now, 'lost'}
  end
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], 'at', ARGV[6], 'data', ARGV[5], 'sig', ARGV[7])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  return {now, 'ok'}
end

-- elect
if not h or h == me then
  redis.call('SET', KEYS[1], me, 'PX', lease) -- replaces whatever was there
  return {now, 'lead'}
end
if redis.call('TYPE', KEYS[2]).ok ~= 'hash' then
  return {now, 'none'}
end
if redis.call('HSTRLEN', KEYS[2], 'data') > tonumber(ARGV[5]) or redis.call('HSTRLEN', KEYS[2], 'at') > 20
    or redis.call('HSTRLEN', KEYS[2], 'sig') > 64 then
  return {now, 'bad', 'too large'}
end
local s = redis.call('HMGET', KEYS[2], 'at', 'data', 'sig')
if not s[1] or not s[2] then
  return {now, 'bad', 'incomplete'}
end
return {now, 'follow', s[1], s[2], s[3] or ''}
