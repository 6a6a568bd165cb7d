if (redis.call('HGET', KEYS[1], F.owed) or '') ~= ARGV[1] then return 0 end
local f = {F.owed, ''}
for i = 2, #ARGV do f[#f + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(f))
redis.call('HDEL', KEYS[1], F.owed_until)
return 1
