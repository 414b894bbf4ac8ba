-- Replaces a reservation's estimate with real usage, frees its leases and writes the ledger, once.
-- KEYS: settled marker, ledger hour hash, ledger day hash, hour index, day index, then two per level:
--   state hash (budgets and windows), lease set.
-- ARGV: lease member, second, day, month, estimate, prompt tokens, completion tokens, ledger field,
--   then three per level: '1' when its token window holds the estimate, '1' when it holds a lease,
--   '1' when its budgets count tokens; last, one character per level, '1' when its token bucket holds
--   the estimate.
-- With the request's audit line (money.py's AuditLines), one key more, last: its account's list for the day,
--   and two ARGV more, last: the line and the list's TTL in seconds; the line is appended even when the
--   reservation was settled before, as it was when it came in a script of its own.
-- Reply: 1 when settled now, 0 when it was settled before.
local levels = math.floor((#KEYS - 5) / 2)
local audited = #KEYS % 2 == 0
if audited then
  redis.call('RPUSH', KEYS[#KEYS], ARGV[#ARGV - 1])
  redis.call('EXPIRE', KEYS[#KEYS], ARGV[#ARGV])
end
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', 172800) then return 0 end
local member, slot, day, month = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local prompt, completion = tonumber(ARGV[6]), tonumber(ARGV[7])
local delta = prompt + completion - tonumber(ARGV[5])
local sec, now_ms = server_time()
local bucket_flags = audited and ARGV[#ARGV - 2] or ARGV[#ARGV]
for i = 1, levels do
  local base, flags = 5 + (i - 1) * 2, 8 + (i - 1) * 3
  if ARGV[flags + 1] == '1' then sw_adjust(KEYS[base + 1], 't', slot, delta, sec, 60) end
  if ARGV[flags + 2] == '1' then redis.call('ZREM', KEYS[base + 2], member) end
  if ARGV[flags + 3] == '1' then
    fw_add(KEYS[base + 1], 'd' .. day, delta, 'd' .. (day - 3))
    fw_add(KEYS[base + 1], 'm' .. month, delta, 'm' .. (month - 3))
  end
  if bucket_flags:sub(i, i) == '1' then tb_adjust(KEYS[base + 1], 'tb', -delta, now_ms) end
end
local field = ARGV[8]
for k = 2, 3 do
  redis.call('HINCRBY', KEYS[k], field .. '|p', prompt)
  redis.call('HINCRBY', KEYS[k], field .. '|c', completion)
  redis.call('HINCRBY', KEYS[k], field .. '|n', 1)
end
local hour = math.floor(slot / 3600)
redis.call('ZADD', KEYS[4], hour, hour)
redis.call('ZADD', KEYS[5], day, day)
-- money (budget.lua), ARGV after the levels' flags: real cost, reserved cost, cached input tokens, '1' when the
-- account has a balance, then each level's charged budget field ('-' when none); the ledger keeps the cost
local at = 8 + levels * 3
local cost, cached = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 3])
for i = 1, levels do
  local last = i == levels
  money_settle(KEYS[5 + (i - 1) * 2 + 1], ARGV[at + 4 + i], cost - tonumber(ARGV[at + 2]), last and ARGV[at + 4] == '1')
end
for k = 2, 3 do
  redis.call('HINCRBY', KEYS[k], field .. '|$', cost)
  redis.call('HINCRBY', KEYS[k], field .. '|ca', cached)
end
return 1
