-- Takes from several shared limits together or from none: per limit, a token bucket (hash fields 'x*')
-- and a concurrency lease set. KEYS, two per limit: bucket hash, lease set.
-- ARGV: tokens, lease member, lease ttl (ms), then three per limit: rate, burst ('-' when no bucket), cap
--   ('-' when none). Reply: {1, 0, 0} when taken, else {0, wait (ms), the 1-based limit that refused}.
local tokens, member, ttl_ms = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local sec, now_ms = server_time()
local buckets = {}
for i = 1, #KEYS / 2 do
  local at = 3 + (i - 1) * 3
  if ARGV[at + 1] ~= '-' then
    local s = redis.call('HMGET', KEYS[i * 2 - 1], 'xk', 'xs')
    buckets[i] = tb_bucket('x', ARGV[at + 1], ARGV[at + 2], s[1], s[2], now_ms)
    local wait = tb_wait_ms(buckets[i], tokens)
    if wait > 0 then return {0, wait, i} end
  end
  local cap = tonumber(ARGV[at + 3])
  if cap and lease_live(KEYS[i * 2], now_ms) >= cap then return {0, 1000, i} end
end
for i = 1, #KEYS / 2 do
  local b = buckets[i]
  if b then
    local out = {'xr', b.rate, 'xb', b.burst}  -- kept for give_back's refill
    tb_stage(b, tokens, now_ms, out)
    redis.call('HSET', KEYS[i * 2 - 1], unpack(out))
    redis.call('PEXPIRE', KEYS[i * 2 - 1], math.ceil(b.burst / b.rate * 1000) + ttl_ms)
  end
  if ARGV[3 + i * 3] ~= '-' then lease_acquire(KEYS[i * 2], member, now_ms, ttl_ms) end
end
return {1, 0, 0}
