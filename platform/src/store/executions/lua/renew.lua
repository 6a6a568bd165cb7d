local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local v = cjson.decode(raw)
if v.state ~= 'claimed' or tonumber(v.token) ~= tonumber(ARGV[1]) then return 0 end
local t = redis.call('TIME')
v.lease_until = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
redis.call('SET', KEYS[1], cjson.encode(v), 'EX', ARGV[3])
return 1
