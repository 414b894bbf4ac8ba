-- KEYS[1] bucket; ARGV rate, burst, cost. Returns {ok, tokens left (string)}.
local sec, now_ms = server_time()
local ok, tokens = tb_take(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), now_ms / 1000)
return {ok, string.format('%.6f', tokens)}
