-- Sliding window over `slots` one-second slots, kept as a hash slot -> count; exact at slot granularity.
local function sw_read(key, sec, slots)
  local raw = redis.call('HGETALL', key)
  local total, live, stale = 0, {}, {}
  for i = 1, #raw, 2 do
    local s = tonumber(raw[i])
    if s > sec - slots then
      local c = tonumber(raw[i + 1])
      total = total + c
      live[#live + 1] = {s, c}
    else
      stale[#stale + 1] = raw[i]
    end
  end
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  table.sort(live, function(a, b) return a[1] < b[1] end)
  return total, live
end

-- Milliseconds until `need` units have left the window.
local function sw_wait_ms(live, need, slots, now_ms, cost, limit)
  if cost > limit then return slots * 1000 end
  local freed = 0
  for _, e in ipairs(live) do
    freed = freed + e[2]
    if freed >= need then return math.max((e[1] + slots) * 1000 - now_ms, 0) end
  end
  return slots * 1000
end

-- Milliseconds until the oldest counted unit (or one added now) leaves the window.
local function sw_reset_ms(live, sec, slots, now_ms)
  local oldest = sec
  if #live > 0 then oldest = live[1][1] end
  return math.max((oldest + slots) * 1000 - now_ms, 0)
end

local function sw_add(key, sec, cost, slots)
  -- Only a new slot moves the expiry: the key outlives its newest slot by one window.
  if redis.call('HINCRBY', key, sec, cost) == cost then redis.call('EXPIRE', key, slots * 2) end
end

-- Corrects a slot still inside the window by `delta` (negative refunds), never below zero.
local function sw_adjust(key, slot, delta, sec, slots)
  if slot <= sec - slots or delta == 0 then return end
  local count = tonumber(redis.call('HGET', key, slot) or '0') + delta
  if count > 0 then redis.call('HSET', key, slot, count) else redis.call('HDEL', key, slot) end
end
