-- Creates an approval once: KEYS[1] its hash. ARGV[1] its state (pending), ARGV[2] its body
-- (JSON), ARGV[3] the job its decision publishes, ARGV[4] its deadline (ms), ARGV[5] its TTL (s),
-- ARGV[6] what hands a client tool's call to its client once approved (empty for a callback's).
-- Answers 1 if created, 0 if it was there (a copy of the step that made the call).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'body', ARGV[2], 'job', ARGV[3], 'deadline_ms', ARGV[4], 'client', ARGV[6])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
