-- Classic token bucket in a hash {tokens, ts}: `burst` capacity refilled at `rate` per second.
local function tb_take(key, rate, burst, cost, now)
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(state[1]) or burst
  local ts = tonumber(state[2]) or now
  if now > ts then
    tokens = math.min(burst, tokens + (now - ts) * rate)
    ts = now
  end
  local ok = 0
  if tokens >= cost then
    tokens = tokens - cost
    ok = 1
  end
  redis.call('HSET', key, 'tokens', string.format('%.6f', tokens), 'ts', string.format('%.6f', ts))
  redis.call('PEXPIRE', key, math.ceil(burst / rate * 1000) + 1000)
  return ok, tokens
end
