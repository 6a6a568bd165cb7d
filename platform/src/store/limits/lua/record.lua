local state = redis.call('HGET', KEYS[1], 'state')
local answer = 'counted'
if ARGV[1] == 'up' then
  redis.call('HSET', KEYS[1], 'consecutive_failures', 0, 'last_success_ms', ARGV[2])
  if state == 'open' then
    redis.call('HSET', KEYS[1], 'state', 'closed', 'closed_at_ms', ARGV[2])
    redis.call('HDEL', KEYS[1], 'opened_at_ms')
    redis.call('DEL', KEYS[2])
    remember(KEYS[3], {at_ms = tonumber(ARGV[2]), state = 'closed', why = 'a call succeeded'}, ARGV[7], ARGV[5])
    answer = 'closed'
  end
else
  local n = redis.call('HINCRBY', KEYS[1], 'consecutive_failures', 1)
  redis.call('HSET', KEYS[1], 'last_failure_ms', ARGV[2], 'probe_interval_ms', ARGV[4])
  local threshold = tonumber(ARGV[3])
  if state == 'open' then
    answer = 'open'
  elseif threshold > 0 and n >= threshold then
    redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at_ms', ARGV[2])
    -- The first probe comes one interval after opening.
    redis.call('SET', KEYS[2], 'opened', 'PX', ARGV[4])
    local why = 'failures in a row: ' .. n .. ' (threshold ' .. threshold .. '); the last: ' .. ARGV[6]
    remember(KEYS[3], {at_ms = tonumber(ARGV[2]), state = 'open', why = why}, ARGV[7], ARGV[5])
    answer = 'opened'
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[5])
return answer
