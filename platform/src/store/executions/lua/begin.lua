local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local c = cjson.decode(raw)
if c.state ~= 'claimed' or tonumber(c.token) ~= tonumber(ARGV[1]) then return 0 end
if redis.call('HGET', KEYS[2], F.status) == S.cancelled then return 2 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[2], F.status, S.running, F.attempts, ARGV[2], F.updated_at_ms, now)
return 1
