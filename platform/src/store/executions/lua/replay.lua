local r = redis.call('HMGET', KEYS[1], F.status, F.gen)
if not r[1] then return -2 end
if r[1] ~= S.dead_lettered then return -1 end
local gen = (tonumber(r[2] or '0') or 0) + 1
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], F.gen, gen, F.step_round, ARGV[1], F.step_attempt, 1, F.step_poll, 0, F.owed, '',
  F.status, S.queued, F.updated_at_ms, now)
redis.call('HDEL', KEYS[1], F.owed_until)
local raw = redis.call('GET', KEYS[2])
if raw then
  local c = cjson.decode(raw)
  redis.call('SET', KEYS[2], cjson.encode({state = 'released', token = c.token}), 'EX', ARGV[2])
end
if redis.call('TTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return gen
