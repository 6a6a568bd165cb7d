local record = redis.call('HMGET', KEYS[1], F.kind, F.status)
local kind, status = record[1], record[2]
if not status then return {'missing', ''} end
if status == S.cancelled then return {'cancelled', S.cancelled} end
if status == S.succeeded or status == S.failed or status == S.dead_lettered then return {'finished', status} end
if kind == K.turn then
  redis.call('HSET', KEYS[1], F.cancel_requested, ARGV[1])
  return {'requested', status}
end
if status == S.queued or status == S.retrying then
  redis.call('HSET', KEYS[1], F.cancel_requested, ARGV[1], F.status, S.cancelled, F.updated_at_ms, ARGV[1])
  return {'cancelled', status}
end
return {'sent', status}
