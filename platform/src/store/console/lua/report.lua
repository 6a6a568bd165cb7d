for i = 7, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
if #ARGV > 6 then redis.call('EXPIRE', KEYS[1], ARGV[5]) end
if ARGV[6] == '1' then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
else
  if ARGV[2] == '' then redis.call('HDEL', KEYS[2], ARGV[1]) else redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[4])
for _, w in ipairs(gone) do
  redis.call('HDEL', KEYS[2], w)
  redis.call('ZREM', KEYS[3], w)
end
redis.call('EXPIRE', KEYS[2], 3600)
redis.call('EXPIRE', KEYS[3], 3600)
return 1
