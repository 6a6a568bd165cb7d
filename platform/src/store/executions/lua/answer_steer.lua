local status = redis.call('HGET', KEYS[2], F.status)
if status ~= S.queued and status ~= S.running and status ~= S.retrying then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local raw = redis.call('GET', KEYS[1])
local token = 0
if raw then token = tonumber(cjson.decode(raw).token) or 0 end
redis.call('SET', KEYS[1], '{"state":"done","token":' .. token .. ',"result":' .. ARGV[1] .. '}', 'EX', ARGV[2])
redis.call('HSET', KEYS[2], F.status, S.succeeded, F.result, ARGV[1], F.updated_at_ms, now, F.owed, '')
return 1
