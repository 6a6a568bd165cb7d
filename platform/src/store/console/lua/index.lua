local batch = tonumber(ARGV[6])
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'NX', ARGV[2], ARGV[1])
  local old = redis.call('ZRANGEBYSCORE', key, '-inf', '(' .. ARGV[3], 'LIMIT', 0, batch)
  if #old > 0 then redis.call('ZREM', key, unpack(old)) end
  local extra = redis.call('ZCARD', key) - tonumber(ARGV[4])
  if extra > 0 then redis.call('ZREMRANGEBYRANK', key, 0, math.min(extra, batch) - 1) end
  redis.call('EXPIRE', key, ARGV[5])
end
return 1
