if ARGV[6] == '1' then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
elseif not redis.call('SET', KEYS[1], ARGV[2], 'NX', 'EX', ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
local old = redis.call('HGET', KEYS[3], ARGV[1])
if old then count(KEYS[4], old, -1) end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[5])
count(KEYS[4], ARGV[5], 1)
return 1
