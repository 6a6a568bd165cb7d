if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], 0, ARGV[3])
if ARGV[5] ~= '' and ARGV[5] ~= ARGV[4] then redis.call('HDEL', KEYS[3], ARGV[5]) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[3], ARGV[4], ARGV[3]) end
return 1
