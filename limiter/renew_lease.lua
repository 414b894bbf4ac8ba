-- KEYS: lease sets; ARGV member, ttl_ms. Returns how many of the leases were still held.
local sec, now_ms = server_time()
local held = 0
for i = 1, #KEYS do held = held + lease_renew(KEYS[i], ARGV[1], now_ms, tonumber(ARGV[2])) end
return held
