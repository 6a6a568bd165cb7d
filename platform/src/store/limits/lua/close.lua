local state = redis.call('HGET', KEYS[1], 'state')
redis.call('HSET', KEYS[1], 'state', 'closed', 'consecutive_failures', 0, 'closed_at_ms', ARGV[1])
redis.call('HDEL', KEYS[1], 'opened_at_ms')
redis.call('DEL', KEYS[2])
redis.call('EXPIRE', KEYS[1], ARGV[2])
if state == 'open' then
  remember(KEYS[3], {at_ms = tonumber(ARGV[1]), state = 'closed', why = 'closed by an operator', by = ARGV[3]}, ARGV[4], ARGV[2])
end
return state or ''
