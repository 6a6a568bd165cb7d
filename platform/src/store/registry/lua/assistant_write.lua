if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return {0, ''} end
local holder = redis.call('HGET', KEYS[2], ARGV[4])
if holder and holder ~= ARGV[3] then return {2, holder} end
if ARGV[5] ~= '' and ARGV[5] ~= ARGV[4] and redis.call('HGET', KEYS[2], ARGV[5]) == ARGV[3] then
  redis.call('HDEL', KEYS[2], ARGV[5])
end
redis.call('HSET', KEYS[2], ARGV[4], ARGV[3])
redis.call('SET', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[3], 0, ARGV[6])
return {1, ''}
