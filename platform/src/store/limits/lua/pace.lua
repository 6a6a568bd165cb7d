local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local interval, tolerance = tonumber(ARGV[2]), tonumber(ARGV[3])
local early, grace = tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%.3f', now - grace))
local function keep()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIREAT', KEYS[1], math.ceil(tonumber(last[2]) + grace)) end
end
local mine = redis.call('ZSCORE', KEYS[1], ARGV[1])
if mine then
  mine = tonumber(mine)
  if mine > now + early then return {0, math.ceil(mine - now)} end
  redis.call('ZREM', KEYS[1], ARGV[1])
  return {1, 0}
end
local tat = tonumber(redis.call('ZSCORE', KEYS[1], '~tat') or now)
if tat < now then tat = now end
local slot = math.max(now, tat - tolerance)
redis.call('ZADD', KEYS[1], string.format('%.3f', tat + interval), '~tat')
if slot > now + early then
  redis.call('ZADD', KEYS[1], string.format('%.3f', slot), ARGV[1])
  keep()
  return {0, math.ceil(slot - now)}
end
keep()
return {1, 0}
