local turn = holder_of(redis.call('GET', KEYS[1]))
if not turn or turn == ARGV[1] then return 0 end
if redis.call('SISMEMBER', KEYS[4], ARGV[1]) == 1 then return 1 end
for _, raw in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local ok, s = pcall(cjson.decode, raw)
  if ok and type(s) == 'table' and s.from == ARGV[1] then return 1 end
end
for i = 3, #ARGV do redis.call('RPUSH', KEYS[3], ARGV[i]) end
redis.call('EXPIRE', KEYS[3], ARGV[2])
redis.call('LREM', KEYS[2], 0, ARGV[1])
return 1
