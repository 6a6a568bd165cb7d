local first = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if redis.call('TTL', KEYS[1]) < tonumber(ARGV[4]) then redis.call('EXPIRE', KEYS[1], ARGV[4]) end
local r = redis.call('HMGET', KEYS[2], F.status, F.step_round, F.pending, F.owed, F.next_published, F.gen, F.message_id)
local answer = {first, '', r[6] or '0', r[7] or ''}
if r[1] ~= S.running and r[1] ~= S.queued and r[1] ~= S.retrying then answer[2] = 'ended' return answer end
if tonumber(r[2] or '-1') ~= tonumber(ARGV[3]) then answer[2] = 'other_round' return answer end
if tonumber(r[5] or '-1') >= tonumber(ARGV[3]) then answer[2] = 'published' return answer end
for key in string.gmatch(r[3] or '', '[^,]+') do
  if redis.call('HEXISTS', KEYS[1], key) == 0 then answer[2] = 'waiting' return answer end
end
local owed = r[4] or ''
if owed == '' or owed == ARGV[6] then
  redis.call('HSET', KEYS[2], F.owed, ARGV[5])
  owed = ARGV[5]
end
if owed == ARGV[5] then answer[2] = 'publish' else answer[2] = 'waiting' end
return answer
