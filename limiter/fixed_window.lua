-- Fixed calendar windows (a day, a month) as fields of one hash per counter owner.

-- Adds `delta` (negative refunds, never below zero) and drops the field from `stale_field` ago.
local function fw_add(key, field, delta, stale_field, ttl)
  local value = redis.call('HINCRBY', key, field, delta)
  if value < 0 then redis.call('HSET', key, field, 0) end
  if value == delta then  -- a new period: forget an old one
    redis.call('HDEL', key, stale_field)
    if ttl then redis.call('EXPIRE', key, ttl) end
  end
end
