if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
local leaves = tonumber(ARGV[4])
for i = 2, #KEYS do
  if i - 1 <= leaves then redis.call('ZREM', KEYS[i], ARGV[3]) else redis.call('ZADD', KEYS[i], 0, ARGV[3]) end
end
return 1
