local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local ok, rec = pcall(cjson.decode, cur)
local id = (ok and type(rec) == 'table' and type(rec.id) == 'string') and rec.id or ''
if ARGV[2] ~= '' and ARGV[2] ~= id then return 0 end
if id ~= '' then redis.call('HDEL', KEYS[3], id) end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
