if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[2], ARGV[3]) == ARGV[2] then redis.call('HDEL', KEYS[2], ARGV[3]) end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[4])
return 1
