-- Token buckets as fields of a hash, one letter pair per bucket (`tag`): '<tag>r' rate per second and
-- '<tag>b' burst (the settings), '<tag>k' tokens and '<tag>s' when they were counted (ms). A bucket starts
-- full. A cost above the burst passes when the bucket is full and leaves a debt: slowed, never barred.
-- The in-memory twin is limiter/token_bucket.py.

-- The bucket as refilled at `now_ms`, from its stored tokens and time (strings or false, as HMGET gives).
local function tb_bucket(tag, rate, burst, tokens, at_ms, now_ms)
  local b = {tag = tag, rate = tonumber(rate), burst = tonumber(burst)}
  b.tokens = tonumber(tokens) or b.burst
  local at = tonumber(at_ms) or now_ms
  if now_ms > at then b.tokens = math.min(b.burst, b.tokens + (now_ms - at) * b.rate / 1000) end
  return b
end

-- Milliseconds until the bucket holds enough for `cost` (0 when it does now).
local function tb_wait_ms(b, cost)
  local short = math.min(cost, b.burst) - b.tokens
  if short <= 0 then return 0 end
  return math.ceil(short * 1000 / b.rate)
end

-- Takes `cost` now: appends the fields to write to `out` (field, value, ...), for the caller's one HSET.
local function tb_stage(b, cost, now_ms, out)
  b.tokens = b.tokens - cost
  local n = #out
  out[n + 1], out[n + 2] = b.tag .. 'k', string.format('%.6f', b.tokens)
  out[n + 3], out[n + 4] = b.tag .. 's', now_ms
end

-- Gives back `refund` (negative takes more) to the bucket `tag` of `key`: at most full, at most one burst
-- in debt. A bucket removed since the take is left alone.
local function tb_adjust(key, tag, refund, now_ms)
  if refund == 0 then return end
  local s = redis.call('HMGET', key, tag .. 'r', tag .. 'b', tag .. 'k', tag .. 's')
  if not s[1] or not s[2] then return end
  local b = tb_bucket(tag, s[1], s[2], s[3], s[4], now_ms)
  local tokens = math.max(math.min(b.tokens + refund, b.burst), -b.burst)
  redis.call('HSET', key, tag .. 'k', string.format('%.6f', tokens), tag .. 's', now_ms)
end
