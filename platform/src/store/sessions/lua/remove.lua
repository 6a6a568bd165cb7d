redis.call('SREM', KEYS[2], ARGV[1])
for _, raw in ipairs(redis.call('LRANGE', KEYS[1], -50, -1)) do
  local ok, m = pcall(cjson.decode, raw)
  if ok and type(m) == 'table' and m.id == ARGV[1] then redis.call('LREM', KEYS[1], 0, raw) end
end
return 1
