-- KEYS[1] window; ARGV limit, cost, slots. Returns {ok, count before, retry_after_ms}.
local sec, now_ms = server_time()
local limit, cost, slots = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local w = sw_load(KEYS[1], 'w', sec, slots)
if w.total + cost > limit then
  return {0, w.total, sw_wait_ms(w, w.total + cost - limit, sec, slots, now_ms, cost, limit)}
end
local before = w.total
sw_add(w, sec, cost, slots * 2)
return {1, before, 0}
