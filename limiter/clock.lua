-- Server time, so that every replica agrees on windows, leases and calendar periods.
local function server_time()
  local t = redis.call('TIME')
  local sec = tonumber(t[1])
  return sec, sec * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

-- Calendar month of a unix second as year * 12 + month - 1 (UTC).
local function month_index(sec)
  local z = math.floor(sec / 86400) + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y * 12 + m - 1
end

-- Unix second at which month `index` (as from month_index) starts.
local function month_start(index)
  return days_from_civil(math.floor(index / 12), index % 12 + 1, 1) * 86400
end
