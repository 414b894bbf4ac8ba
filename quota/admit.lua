-- One atomic check-and-reserve across the levels of one key: the key, its sub-account, its account.
-- KEYS, five per level: quota hash, request window, token window, budget hash, lease set.
-- ARGV: estimated tokens, lease ttl (ms), lease member.
-- Reply (space-separated integers): admitted, refused level (1-based, 0 if none), refused limit (1 rpm, 2 tpm, 3 concurrency,
--   4 tokens_per_day, 5 tokens_per_month), retry (ms), second, day, month, limit/remaining/reset (ms) of
--   the tightest request window and token window (-1 when none), then each level's five quotas.
local est, ttl_ms, member = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local sec, now_ms = server_time()
local day, month = math.floor(sec / 86400), month_index(sec)
local day_field, month_field = 'd' .. day, 'm' .. month
local levels = #KEYS / 5
local quotas, reply = {}, {0, 0, 0, 0, sec, day, month, -1, -1, -1, -1, -1, -1}
for i = 1, levels do
  local q = redis.call('HMGET', KEYS[(i - 1) * 5 + 1], 'rpm', 'tpm', 'max_concurrency', 'tokens_per_day',
    'tokens_per_month')
  for j = 1, 5 do
    q[j] = tonumber(q[j]) or -1
    reply[#reply + 1] = q[j]
  end
  quotas[i] = q
end

local function refuse(level, code, ms)
  if reply[2] == 0 then reply[2], reply[3], reply[4] = level, code, math.max(ms, 0) end
end

-- Keeps the window with the least room left, for the x-ratelimit-* headers (offset 8 or 11).
local function offer(at, limit, remaining, reset_ms)
  remaining = math.max(remaining, 0)
  if reply[at] < 0 or remaining < reply[at + 1] then
    reply[at], reply[at + 1], reply[at + 2] = limit, remaining, reset_ms
  end
end

local function check_window(i, key, limit, cost, code, at)
  local total, live = sw_read(key, sec, 60)
  local fits = total + cost <= limit
  offer(at, limit, limit - total - (fits and cost or 0), sw_reset_ms(live, sec, 60, now_ms))
  if not fits then refuse(i, code, sw_wait_ms(live, total + cost - limit, 60, now_ms, cost, limit)) end
end

for i = 1, levels do
  local base, q = (i - 1) * 5, quotas[i]
  if q[1] >= 0 then check_window(i, KEYS[base + 2], q[1], 1, 1, 8) end
  if q[2] >= 0 then check_window(i, KEYS[base + 3], q[2], est, 2, 11) end
  if reply[2] == 0 then
    if q[3] >= 0 and lease_live(KEYS[base + 5], now_ms) >= q[3] then
      refuse(i, 3, 1000)
    elseif q[4] >= 0 and fw_used(KEYS[base + 4], day_field) + est > q[4] then
      refuse(i, 4, (day + 1) * 86400000 - now_ms)
    elseif q[5] >= 0 and fw_used(KEYS[base + 4], month_field) + est > q[5] then
      refuse(i, 5, month_start(month + 1) * 1000 - now_ms)
    end
  end
end

if reply[2] == 0 then
  reply[1] = 1
  for i = 1, levels do
    local base, q = (i - 1) * 5, quotas[i]
    if q[1] >= 0 then sw_add(KEYS[base + 2], sec, 1, 60) end
    if q[2] >= 0 then sw_add(KEYS[base + 3], sec, est, 60) end
    if q[3] >= 0 then lease_acquire(KEYS[base + 5], member, now_ms, ttl_ms) end
    if q[4] >= 0 or q[5] >= 0 then
      fw_add(KEYS[base + 4], day_field, est, 'd' .. (day - 3), 40 * 86400)
      fw_add(KEYS[base + 4], month_field, est, 'm' .. (month - 3), 40 * 86400)
    end
  end
end
-- One bulk string instead of an array: a client parses one line, not two dozen.
return table.concat(reply, ' ')
