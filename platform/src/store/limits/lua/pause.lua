local pause, grace = tonumber(ARGV[1]), tonumber(ARGV[2])
local paused = math.max(now + pause, tonumber(redis.call('ZSCORE', KEYS[1], '~paused') or 0))
redis.call('ZADD', KEYS[1], string.format('%.3f', paused), '~paused')
load(3)
for _, b in ipairs(buckets) do b.tat = math.max(b.tat, paused + b.tol) end
save()
keep(grace)
return math.ceil(paused - now)
