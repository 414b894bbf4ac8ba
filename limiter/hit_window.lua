-- KEYS[1] window; ARGV limit, cost, slots. Returns {ok, count before, retry_after_ms}.
local sec, now_ms = server_time()
local limit, cost, slots = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local w = sw_read(KEYS[1], sec, slots)['w'] or SW_EMPTY
if w.total + cost > limit then
  return {0, w.total, sw_wait_ms(w, w.total + cost - limit, slots, now_ms, cost, limit)}
end
sw_add(KEYS[1], 'w', sec, cost, slots)
return {1, w.total, 0}
