local turn, fence = holder_of(redis.call('GET', KEYS[1]))
if turn ~= ARGV[1] then
  local free = turn == nil and '1' or ''
  return {'not_holder', redis.call('LINDEX', KEYS[2], 0) or '', free}
end
if fence > tonumber(ARGV[2]) then return {'stale', '', ''} end
if redis.call('LLEN', KEYS[3]) > 0 then return {'steer', '', ''} end
local n = #ARGV - 5
if n > 0 and redis.call('SADD', KEYS[6], ARGV[3]) == 1 then
  local last = redis.call('INCRBY', KEYS[5], n)
  local bytes = 0
  for i = 1, n do
    local seq = last - n + i
    local entry = '{"seq":' .. seq .. ',' .. string.sub(ARGV[i + 5], 2)
    bytes = bytes + string.len(entry)
    redis.call('RPUSH', KEYS[4], entry)
  end
  redis.call('INCRBY', KEYS[7], bytes)
  for i = 4, 7 do redis.call('EXPIRE', KEYS[i], ARGV[4]) end
end
if ARGV[5] ~= '' then redis.call('SET', KEYS[8], ARGV[5], 'EX', ARGV[4]) end
redis.call('DEL', KEYS[1])
local size = redis.call('LLEN', KEYS[4]) .. ' ' .. (redis.call('GET', KEYS[7]) or '0')
return {'released', redis.call('LINDEX', KEYS[2], 0) or '', '1', size}
