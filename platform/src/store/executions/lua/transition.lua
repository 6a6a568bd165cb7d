local token = tonumber(ARGV[1])
local raw = redis.call('GET', KEYS[1])
local c = nil
if raw then c = cjson.decode(raw) end
if ARGV[5] ~= '' then
  if (redis.call('HGET', KEYS[2], F.owed) or '') ~= ARGV[5] then return 0 end
elseif c then
  local mine = tonumber(c.token) == token
  if c.state == 'done' then
    if mine and ARGV[3] == 'complete' then return 1 end
    return 0
  end
  if c.state ~= 'claimed' or not mine then return 0 end
elseif tonumber(redis.call('HGET', KEYS[2], F.fence) or '0') > token then
  return 0
end
local ttl = tonumber(ARGV[2])
if ARGV[3] == 'complete' then
  redis.call('SET', KEYS[1], '{"state":"done","token":' .. ARGV[1] .. ',"result":' .. ARGV[8] .. '}', 'EX', ARGV[2])
elseif ARGV[3] == 'release' then
  redis.call('SET', KEYS[1], cjson.encode({state = ARGV[9], token = token}), 'EX', ttl)
elseif ARGV[3] == 'keep' and not c then
  redis.call('SET', KEYS[1], cjson.encode({state = 'claimed', token = token, owner = 'restored',
    lease_until = now + tonumber(ARGV[4])}), 'EX', ttl)
end
local f = {F.updated_at_ms, int(now)}
if ARGV[5] == '' then f[#f + 1] = F.fence; f[#f + 1] = ARGV[1] end
if ARGV[8] ~= '' then f[#f + 1] = F.result; f[#f + 1] = ARGV[8] end
for i = 10, #ARGV do f[#f + 1] = ARGV[i] end
redis.call('HSET', KEYS[2], unpack(f))
local keep = outlive(KEYS[2], ARGV[2])
if ARGV[6] ~= '' then
  redis.call('RPUSH', KEYS[3], ARGV[6])
  redis.call('EXPIRE', KEYS[3], int(keep))
end
if ARGV[7] ~= '' then redis.call('SET', KEYS[4], ARGV[7], 'EX', int(keep)) end
return 1
