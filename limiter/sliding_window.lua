-- Sliding windows over `slots` one-second slots, exact at slot granularity. One hash can hold several
-- series (one letter each, such as 'r' for requests and 't' for tokens): per series, fields '<tag><second>'
-- hold each slot's count, '<tag>t' the running total and '<tag>o' the oldest slot that may hold units,
-- so a check costs O(1) however full the window is (each slot is expired once).

-- Series `tag` of hash `key` from its stored total, oldest slot and current slot's count (strings or
-- false, as HMGET gives them), expiring the slots that have left the window.
local function sw_window(key, tag, total, oldest, current, sec, slots)
  local w = {key = key, tag = tag, total = tonumber(total) or 0, oldest = tonumber(oldest) or sec,
             current = tonumber(current) or 0}
  local first = sec - slots + 1  -- the oldest slot still inside the window
  if w.total > 0 and w.oldest < first then
    local stale = {}
    for s = w.oldest, math.min(first - 1, w.oldest + slots - 1) do stale[#stale + 1] = tag .. s end
    local counts = redis.call('HMGET', key, unpack(stale))
    for i = 1, #stale do w.total = w.total - (tonumber(counts[i]) or 0) end
    redis.call('HDEL', key, unpack(stale))
    w.oldest = first
    if w.total <= 0 then w.total, w.oldest = 0, sec end
    redis.call('HSET', key, tag .. 't', w.total, tag .. 'o', w.oldest)
  end
  return w
end

local function sw_load(key, tag, sec, slots)
  local state = redis.call('HMGET', key, tag .. 't', tag .. 'o', tag .. sec)
  return sw_window(key, tag, state[1], state[2], state[3], sec, slots)
end

-- The counts of the window's live slots, oldest first: {{slot, count}, ...}.
local function sw_slots(w, sec)
  local names = {}
  for s = w.oldest, sec do names[#names + 1] = w.tag .. s end
  local counts = redis.call('HMGET', w.key, unpack(names))
  local live = {}
  for i = 1, #names do
    local c = tonumber(counts[i])
    if c and c > 0 then live[#live + 1] = {w.oldest + i - 1, c} end
  end
  return live
end

-- Milliseconds until `need` units have left the window (read only when refusing).
local function sw_wait_ms(w, need, sec, slots, now_ms, cost, limit)
  if cost > limit then return slots * 1000 end
  local freed = 0
  for _, e in ipairs(sw_slots(w, sec)) do
    freed = freed + e[2]
    if freed >= need then return math.max((e[1] + slots) * 1000 - now_ms, 0) end
  end
  return slots * 1000
end

-- Milliseconds until the oldest counted unit (or one added now) may leave the window.
local function sw_reset_ms(w, sec, slots, now_ms)
  local oldest = sec
  if w.total > 0 then oldest = w.oldest end
  return math.max((oldest + slots) * 1000 - now_ms, 0)
end

-- Counts `cost` now: appends the fields to write to `out` (field, value, ...), so that a caller writes
-- everything it changed in one HSET. Returns true when the slot is new.
local function sw_stage(w, sec, cost, out)
  if w.total <= 0 then w.oldest = sec end
  w.total = w.total + cost
  local n = #out
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = w.tag .. 't', w.total, w.tag .. 'o', w.oldest
  out[n + 5], out[n + 6] = w.tag .. sec, w.current + cost
  return w.current == 0
end

-- Corrects a slot still inside the window by `delta` (negative refunds), never below zero.
local function sw_adjust(key, tag, slot, delta, sec, slots)
  if delta == 0 then return end
  local w = sw_load(key, tag, sec, slots)
  if slot <= sec - slots or slot < w.oldest or w.total <= 0 and delta < 0 then return end
  local field = tag .. slot
  local count = tonumber(redis.call('HGET', key, field) or '0')
  local change = math.max(count + delta, 0) - count
  if count + change > 0 then redis.call('HSET', key, field, count + change) else redis.call('HDEL', key, field) end
  redis.call('HINCRBY', key, tag .. 't', change)
end
