-- One atomic check-and-reserve across the levels of one key: the key, its sub-account, its account.
-- KEYS, two per level: state hash (quota fields, budget counters, request window 'r' and token window
--   't'), lease set.
-- ARGV: estimated tokens, lease ttl (ms), lease member.
-- Reply, an array: admitted, refused level (1-based, 0 if none), refused limit (1 rpm, 2 tpm,
--   3 concurrency, 4 tokens_per_day, 5 tokens_per_month, 6 request_bucket, 7 token_bucket), retry (ms),
--   second, day, month, limit/remaining/reset (ms) of the tightest request window and token window (-1 when
--   none), then each level's five quotas as stored ('-' when unlimited), then each level's bucket settings
--   (request rate, burst, token rate, burst; '-' when none).
local est, ttl_ms, member = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
-- money (budget.lua): ARGV[4] the request's maximum cost in micro-units, ARGV[5..13] the calendar bounds;
-- the reply ends (after the bucket settings) with each level's budget spec and charged field, then '1' when the
-- account has a balance
local cost, money_bounds_now, money = tonumber(ARGV[4]), money_bounds(5), {}
local sec, now_ms = server_time()
local day, month = math.floor(sec / 86400), month_index(sec)
local day_field, month_field = 'd' .. day, 'm' .. month
local levels = #KEYS / 2
local reply, quota_text, bucket_text = {0, 0, 0, 0, sec, day, month, -1, -1, -1, -1, -1, -1}, {}, {}

local function refuse(level, code, ms)
  if reply[2] == 0 then reply[2], reply[3], reply[4] = level, code, math.max(ms, 0) end
end

-- Keeps the window with the least room left, for the x-ratelimit-* headers (reply offset 8 or 11).
local function offer(at, limit, remaining, reset_ms)
  remaining = math.max(remaining, 0)
  if reply[at] < 0 or remaining < reply[at + 1] then
    reply[at], reply[at + 1], reply[at + 2] = limit, remaining, reset_ms
  end
end

local function check_window(i, w, limit, cost, code, at)
  local fits = w.total + cost <= limit
  offer(at, limit, limit - w.total - (fits and cost or 0), sw_reset_ms(w, sec, 60, now_ms))
  if not fits then refuse(i, code, sw_wait_ms(w, w.total + cost - limit, sec, 60, now_ms, cost, limit)) end
  return w
end

-- Token buckets: the stored settings and state (HMGET values from `at`), refilled to now, or nil when none.
local function check_bucket(i, s, at, tag, cost, code)
  bucket_text[#bucket_text + 1], bucket_text[#bucket_text + 2] = s[at] or '-', s[at + 1] or '-'
  if not s[at] or not s[at + 1] then return nil end
  local b = tb_bucket(tag, s[at], s[at + 1], s[at + 2], s[at + 3], now_ms)
  local wait = tb_wait_ms(b, cost)
  if wait > 0 then refuse(i, code, wait) end
  return b
end

local states = {}
for i = 1, levels do
  local key = KEYS[(i - 1) * 2 + 1]
  local s = redis.call('HMGET', key, 'rpm', 'tpm', 'max_concurrency', 'tokens_per_day', 'tokens_per_month',
    day_field, month_field, 'rt', 'ro', 'r' .. sec, 'tt', 'to', 't' .. sec,
    'rbr', 'rbb', 'rbk', 'rbs', 'tbr', 'tbb', 'tbk', 'tbs')
  for j = 1, 5 do
    quota_text[#quota_text + 1] = s[j] or '-'
    s[j] = tonumber(s[j]) or -1
  end
  s[6], s[7] = tonumber(s[6]) or 0, tonumber(s[7]) or 0
  if s[1] >= 0 then s.r = check_window(i, sw_window(key, 'r', s[8], s[9], s[10], sec, 60), s[1], 1, 1, 8) end
  if s[2] >= 0 then
    s.t = check_window(i, sw_window(key, 't', s[11], s[12], s[13], sec, 60), s[2], est, 2, 11)
  end
  s.rb, s.tb = check_bucket(i, s, 14, 'rb', 1, 6), check_bucket(i, s, 18, 'tb', est, 7)
  if reply[2] == 0 then
    if s[3] >= 0 and lease_live(KEYS[i * 2], now_ms) >= s[3] then
      refuse(i, 3, 1000)
    elseif s[4] >= 0 and s[6] + est > s[4] then
      refuse(i, 4, (day + 1) * 86400000 - now_ms)
    elseif s[5] >= 0 and s[7] + est > s[5] then
      refuse(i, 5, month_start(month + 1) * 1000 - now_ms)
    end
  end
  local money_code, money_wait
  money[i], money_code, money_wait = money_check(key, i == levels, cost, money_bounds_now, sec, now_ms)
  if money_code and reply[2] == 0 then refuse(i, money_code, money_wait) end
  states[i] = s
end

if reply[2] == 0 then
  reply[1] = 1
  for i = 1, levels do
    local key, s, out = KEYS[(i - 1) * 2 + 1], states[i], {}
    if s.r then sw_stage(s.r, sec, 1, out) end
    if s.t then sw_stage(s.t, sec, est, out) end
    if s.rb then tb_stage(s.rb, 1, now_ms, out) end
    if s.tb then tb_stage(s.tb, est, now_ms, out) end
    if s[4] >= 0 or s[5] >= 0 then
      local n = #out
      out[n + 1], out[n + 2], out[n + 3], out[n + 4] = day_field, s[6] + est, month_field, s[7] + est
      if s[6] == 0 then redis.call('HDEL', key, 'd' .. (day - 3), 'm' .. (month - 3)) end  -- a new period
    end
    if #out > 0 then redis.call('HSET', key, unpack(out)) end
    if s[3] >= 0 then lease_acquire(KEYS[i * 2], member, now_ms, ttl_ms) end
    money_charge(key, money[i], cost)
  end
end
for _, q in ipairs(quota_text) do reply[#reply + 1] = q end
for _, q in ipairs(bucket_text) do reply[#reply + 1] = q end
for i = 1, levels do reply[#reply + 1], reply[#reply + 2] = money[i].spec, money[i].field end
reply[#reply + 1] = money[levels].balance and '1' or '0'
return reply
