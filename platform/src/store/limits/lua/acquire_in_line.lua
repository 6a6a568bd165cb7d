local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder, turn, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local lease, recheck = tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local function grant()
  redis.call('ZADD', KEYS[1], now + lease, holder)
  redis.call('ZREM', KEYS[2], turn)
  redis.call('HDEL', KEYS[3], turn)
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[1], tonumber(last[2]) + 1000)
  return {1, 0}
end
if redis.call('ZSCORE', KEYS[1], holder) then return grant() end
for _, m in ipairs(redis.call('ZRANGE', KEYS[2], 0, 9)) do
  if m ~= turn and tonumber(redis.call('HGET', KEYS[3], m) or 0) < now then
    redis.call('ZREM', KEYS[2], m)
    redis.call('HDEL', KEYS[3], m)
  end
end
local free = limit - redis.call('ZCARD', KEYS[1])
local rank = redis.call('ZRANK', KEYS[2], turn)
if not rank then
  if free > redis.call('ZCARD', KEYS[2]) then return grant() end
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2]
  redis.call('ZADD', KEYS[2], tonumber(last or 0) + 1, turn)
  rank = redis.call('ZRANK', KEYS[2], turn)
end
if rank < free then return grant() end
local wait = recheck * (1 + math.floor((rank - math.max(free, 0)) / limit))
redis.call('HSET', KEYS[3], turn, now + 3 * wait + 1000)
for i = 2, 3 do redis.call('PEXPIRE', KEYS[i], 3 * wait + 60000) end
return {0, wait}
