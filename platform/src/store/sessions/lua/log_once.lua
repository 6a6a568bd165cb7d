local seq = 0
if redis.call('SADD', KEYS[3], ARGV[1]) == 1 then
  seq = redis.call('INCR', KEYS[2])
  redis.call('RPUSH', KEYS[1], '{"seq":' .. seq .. ',' .. string.sub(ARGV[4], 2))
  redis.call('LTRIM', KEYS[1], -tonumber(ARGV[3]), -1)
  for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ARGV[2]) end
end
