if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local f = {}
for i = 3, #ARGV do f[#f + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(f))
redis.call('EXPIRE', KEYS[1], ARGV[1])
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[1]) end
return 1
