if redis.call('LINDEX', KEYS[1], 0) ~= ARGV[1] then return 0 end
redis.call('LTRIM', KEYS[1], tonumber(ARGV[2]), -1)
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[4])
return 1
