-- Sliding windows over `slots` one-second slots. One hash can hold several series (one letter each, such as
-- 'r' for requests and 't' for tokens) as fields '<series><second>' -> count; exact at slot granularity.

-- Reads every series of a window hash, dropping slots that have left the window:
-- series letter -> {total = units inside the window, live = {{slot, count}, ...}, oldest = slot}.
local function sw_read(key, sec, slots)
  local raw = redis.call('HGETALL', key)
  local series, stale = {}, {}
  for i = 1, #raw, 2 do
    local name = raw[i]
    local slot = tonumber(string.sub(name, 2))
    if slot > sec - slots then
      local tag = string.sub(name, 1, 1)
      local w = series[tag]
      if not w then
        w = {total = 0, live = {}, oldest = slot}
        series[tag] = w
      end
      local count = tonumber(raw[i + 1])
      w.total = w.total + count
      w.live[#w.live + 1] = {slot, count}
      if slot < w.oldest then w.oldest = slot end
    else
      stale[#stale + 1] = name
    end
  end
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  return series
end

local SW_EMPTY = {total = 0, live = {}}

-- Milliseconds until `need` units have left the window `w` (from sw_read).
local function sw_wait_ms(w, need, slots, now_ms, cost, limit)
  if cost > limit then return slots * 1000 end
  table.sort(w.live, function(a, b) return a[1] < b[1] end)
  local freed = 0
  for _, e in ipairs(w.live) do
    freed = freed + e[2]
    if freed >= need then return math.max((e[1] + slots) * 1000 - now_ms, 0) end
  end
  return slots * 1000
end

-- Milliseconds until the oldest counted unit (or one added now) leaves the window.
local function sw_reset_ms(w, sec, slots, now_ms)
  return math.max(((w.oldest or sec) + slots) * 1000 - now_ms, 0)
end

local function sw_add(key, tag, sec, cost, slots)
  -- Only a new slot moves the expiry: the hash outlives its newest slot by one window.
  if redis.call('HINCRBY', key, tag .. sec, cost) == cost then redis.call('EXPIRE', key, slots * 2) end
end

-- Corrects a slot still inside the window by `delta` (negative refunds), never below zero.
local function sw_adjust(key, tag, slot, delta, sec, slots)
  if slot <= sec - slots or delta == 0 then return end
  local field = tag .. slot
  local count = tonumber(redis.call('HGET', key, field) or '0') + delta
  if count > 0 then redis.call('HSET', key, field, count) else redis.call('HDEL', key, field) end
end
