if redis.call('SISMEMBER', KEYS[3], ARGV[3]) == 1 then return 'done' end
local turn, fence = holder_of(redis.call('GET', KEYS[1]))
if turn ~= ARGV[1] then return 'not_holder' end
if fence > tonumber(ARGV[2]) then return 'stale' end
redis.call('SADD', KEYS[3], ARGV[3])
local up_to = tonumber(ARGV[5])
local removed = 0
while true do
  local head = redis.call('LINDEX', KEYS[2], 0)
  if not head then break end
  local ok, e = pcall(cjson.decode, head)
  if ok and type(e) == 'table' and type(e.seq) == 'number' and e.seq > up_to then break end
  redis.call('LPOP', KEYS[2])
  removed = removed + string.len(head)
end
local entry = '{"seq":' .. ARGV[5] .. ',' .. string.sub(ARGV[6], 2)
redis.call('LPUSH', KEYS[2], entry)
local bytes = tonumber(redis.call('GET', KEYS[4]) or '0') - removed + string.len(entry)
if bytes < 0 then bytes = 0 end
redis.call('SET', KEYS[4], bytes)
for i = 2, 4 do redis.call('EXPIRE', KEYS[i], ARGV[4]) end
return 'compacted'
