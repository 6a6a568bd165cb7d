local ids = {}
for i = E + 5, #ARGV do
  ids[#ids + 1] = redis.call('XADD', KEYS[K], 'MAXLEN', '~', ARGV[E + 1], '*', 'data', ARGV[i])
end
redis.call('EXPIRE', KEYS[K], ARGV[E + 2])
redis.call('PUBLISH', ARGV[E + 3], ARGV[E + 4])
return ids
