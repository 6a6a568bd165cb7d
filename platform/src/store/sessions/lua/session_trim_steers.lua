local turn, fence = holder_of(redis.call('GET', KEYS[1]))
if turn ~= ARGV[1] or fence > tonumber(ARGV[2]) then return 0 end
local taken = {}
for i = 4, #ARGV do
  taken[ARGV[i]] = true
  redis.call('SADD', KEYS[3], ARGV[i])
end
redis.call('EXPIRE', KEYS[3], ARGV[3])
for _, raw in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  local ok, s = pcall(cjson.decode, raw)
  if ok and type(s) == 'table' and taken[s.from] then redis.call('LREM', KEYS[2], 0, raw) end
end
return 1
