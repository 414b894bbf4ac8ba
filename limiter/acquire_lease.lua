-- KEYS[1] lease set; ARGV member, limit, ttl_ms. Returns 1 when the slot is taken.
local sec, now_ms = server_time()
if lease_live(KEYS[1], now_ms) >= tonumber(ARGV[2]) then return 0 end
lease_acquire(KEYS[1], ARGV[1], now_ms, tonumber(ARGV[3]))
return 1
