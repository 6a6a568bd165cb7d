local function opened(answer)
  local history, step = {}, ''
  if ARGV[4] ~= '' then
    step = redis.call('GET', KEYS[6]) or ''
    history = redis.call('LRANGE', KEYS[3], 0, -1)
    redis.call('EXPIRE', KEYS[3], ARGV[4])
    redis.call('EXPIRE', KEYS[4], ARGV[4])
  end
  return {answer, history, redis.call('LRANGE', KEYS[5], 0, -1), step}
end
local turn, fence = holder_of(redis.call('GET', KEYS[1]))
local mine = ARGV[1] .. '#' .. ARGV[2]
if turn == ARGV[1] then
  if fence > tonumber(ARGV[2]) then return {'stale', {}, {}, ''} end
  redis.call('SET', KEYS[1], mine, 'EX', ARGV[3])
  return opened('held')
end
if turn then return {'busy', {}, {}, ''} end
local head = redis.call('LINDEX', KEYS[2], 0)
if head and head ~= ARGV[1] then return {'queued', {}, {}, ''} end
if head == ARGV[1] then redis.call('LPOP', KEYS[2]) end
redis.call('SET', KEYS[1], mine, 'EX', ARGV[3])
return opened('acquired')
