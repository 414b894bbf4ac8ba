-- Concurrency leases: a sorted set of member -> expiry (ms); a lease not renewed lapses by itself.
local function lease_live(key, now_ms)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now_ms)
  return redis.call('ZCARD', key)
end

local function lease_acquire(key, member, now_ms, ttl_ms)
  redis.call('ZADD', key, now_ms + ttl_ms, member)
  redis.call('PEXPIRE', key, ttl_ms * 2)
end

local function lease_renew(key, member, now_ms, ttl_ms)
  local changed = redis.call('ZADD', key, 'XX', 'CH', now_ms + ttl_ms, member)
  if changed > 0 then redis.call('PEXPIRE', key, ttl_ms * 2) end
  return changed
end
