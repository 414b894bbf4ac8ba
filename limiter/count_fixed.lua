-- KEYS[1] counter hash; ARGV window (s), limit, cost. Counts in the current fixed window (a field named by
-- the window's index). Returns {ok, count before, ms until the window ends}.
local sec, now_ms = server_time()
local window, limit, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local index = math.floor(sec / window)
local used = tonumber(redis.call('HGET', KEYS[1], index) or '0')
local ends_ms = (index + 1) * window * 1000 - now_ms
if used + cost > limit then return {0, used, ends_ms} end
fw_add(KEYS[1], tostring(index), cost, tostring(index - 2), window * 3)
return {1, used, ends_ms}
