local turn = holder_of(redis.call('GET', KEYS[1]))
redis.call('LREM', KEYS[2], 0, ARGV[1])
if turn == ARGV[1] then
  local steers = redis.call('LRANGE', KEYS[3], 0, -1)
  redis.call('DEL', KEYS[3], KEYS[1])
  for i = #steers, 1, -1 do
    local ok, s = pcall(cjson.decode, steers[i])
    if ok and type(s) == 'table' and type(s.from) == 'string' and s.from ~= '' then
      redis.call('LREM', KEYS[2], 0, s.from)
      redis.call('LPUSH', KEYS[2], s.from)
    end
  end
  redis.call('EXPIRE', KEYS[2], ARGV[2])
elseif turn then
  return ''
end
return redis.call('LINDEX', KEYS[2], 0) or ''
