-- KEYS[1] window; ARGV limit, cost, slots. Returns {ok, count before, retry_after_ms}.
local sec, now_ms = server_time()
local limit, cost, slots = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local w = sw_load(KEYS[1], 'w', sec, slots)
if w.total + cost > limit then
  return {0, w.total, sw_wait_ms(w, w.total + cost - limit, sec, slots, now_ms, cost, limit)}
end
local before, out = w.total, {}
local new_slot = sw_stage(w, sec, cost, out)
redis.call('HSET', KEYS[1], unpack(out))
if new_slot then redis.call('EXPIRE', KEYS[1], slots * 2) end
return {1, before, 0}
