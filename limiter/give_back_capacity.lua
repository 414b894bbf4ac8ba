-- Ends what take_capacity took: refunds `refund` tokens (negative takes more) to each bucket and frees the
-- lease. KEYS as take_capacity's; ARGV: refund, lease member.
local sec, now_ms = server_time()
for i = 1, #KEYS / 2 do
  tb_adjust(KEYS[i * 2 - 1], 'x', tonumber(ARGV[1]), now_ms)
  redis.call('ZREM', KEYS[i * 2], ARGV[2])
end
return 1
