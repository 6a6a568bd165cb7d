local function remember(key, entry, max, ttl)
  redis.call('LPUSH', key, cjson.encode(entry))
  redis.call('LTRIM', key, 0, tonumber(max) - 1)
  redis.call('EXPIRE', key, ttl)
end
