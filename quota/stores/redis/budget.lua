-- Money: budgets over windows and the account's prepaid balance, in micro-units (quota/budget.py is the twin).
-- A level's state hash holds 'budget' ("<amount> <window>"), its spend per period ('bs<start second>' for day,
-- week and month, 'br<utc day>' for rolling days, 'bt' for total), 'bcur' (the calendar field now counted) and,
-- on an account with a prepaid balance, 'balance'.

-- The account's calendar periods from ARGV[at]: day, week and month, each as the start of the period the
-- gateway's clock is in, of the next and of the one after; server time picks one of the first two.
local function money_bounds(at)
  local b = {}
  for k, name in ipairs({'day', 'week', 'month'}) do
    local i = at + (k - 1) * 3
    b[name] = {tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])}
  end
  return b
end

-- The spend fields a budget counts now (the one to charge last), its amount, the field that leaves the window
-- now (false when none) and the ms until room frees.
local function budget_window(spec, bounds, sec, now_ms)
  local amount, window = string.match(spec, '^(%d+) (.+)$')
  amount = tonumber(amount)
  if window == 'total' then return {'bt'}, amount, false, 31536000000 end
  local n = tonumber(string.match(window, '^rolling_days:(%d+)$'))
  if n then
    local day, fields = math.floor(sec / 86400), {}
    for d = day - n + 1, day do fields[#fields + 1] = 'br' .. d end
    return fields, amount, 'br' .. (day - n), (day + 1) * 86400000 - now_ms
  end
  local b = bounds[window]
  local i = sec >= b[2] and 2 or 1
  return {'bs' .. b[i]}, amount, false, b[i + 1] * 1000 - now_ms
end

-- One level's budget, and the balance when `is_account`, against `cost`: what to charge, then the refusal code
-- (21 budget, 22 balance; nil when it fits) and its wait in ms.
local function money_check(key, is_account, cost, bounds, sec, now_ms)
  local got = redis.call('HMGET', key, 'budget', 'balance')
  local m = {balance = is_account and got[2] ~= false, field = '-', spec = got[1] or '-'}
  if got[1] then
    local fields, amount, stale, wait = budget_window(got[1], bounds, sec, now_ms)
    local used = 0
    for _, v in ipairs(redis.call('HMGET', key, unpack(fields))) do used = used + (tonumber(v) or 0) end
    if used + cost > amount then return m, 21, wait end
    m.field, m.stale = fields[#fields], stale
  end
  if m.balance and tonumber(got[2]) < cost then return m, 22, 3600000 end
  return m
end

-- Reserves `cost` on what money_check found; a calendar budget entering a new period forgets the old one.
local function money_charge(key, m, cost)
  if m.field ~= '-' then
    redis.call('HINCRBY', key, m.field, cost)
    if m.stale then redis.call('HDEL', key, m.stale) end
    if string.sub(m.field, 1, 2) == 'bs' then
      local current = redis.call('HGET', key, 'bcur')
      if current ~= m.field then
        if current then redis.call('HDEL', key, current) end
        redis.call('HSET', key, 'bcur', m.field)
      end
    end
  end
  if m.balance then redis.call('HINCRBY', key, 'balance', -cost) end
end

-- Replaces a reservation's cost with the real one (`delta` = real - reserved) on its budget field and balance;
-- a period that has ended since keeps what it counted.
local function money_settle(key, field, delta, balance)
  if field ~= '-' and redis.call('HEXISTS', key, field) == 1 then
    if redis.call('HINCRBY', key, field, delta) < 0 then redis.call('HSET', key, field, 0) end
  end
  if balance then
    -- a cost above the reservation (the prompt was estimated) empties a balance, never overdraws it
    local left = redis.call('HINCRBY', key, 'balance', -delta)
    if delta > 0 and left < 0 then redis.call('HSET', key, 'balance', 0) end
  end
end
