-- KEYS[1] window; ARGV limit, cost, slots. Returns {ok, count before, retry_after_ms}.
local sec, now_ms = server_time()
local limit, cost, slots = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local total, live = sw_read(KEYS[1], sec, slots)
if total + cost > limit then
  return {0, total, sw_wait_ms(live, total + cost - limit, slots, now_ms, cost, limit)}
end
sw_add(KEYS[1], sec, cost, slots)
return {1, total, 0}
