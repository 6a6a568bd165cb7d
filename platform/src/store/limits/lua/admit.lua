if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return {'closed', 0} end
local interval = tonumber(redis.call('HGET', KEYS[1], 'probe_interval_ms')) or tonumber(ARGV[1])
if redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', interval) then
  local head = redis.call('LINDEX', KEYS[3], 0)
  local last = head and cjson.decode(head)
  if last and last.state == 'half_open' then
    last.probes = (tonumber(last.probes) or 1) + 1
    last.last_probe_ms = tonumber(ARGV[3])
    last.execution_id = ARGV[2]
    redis.call('LSET', KEYS[3], 0, cjson.encode(last))
  else
    local entry = {at_ms = tonumber(ARGV[3]), state = 'half_open', why = 'a probe call let through',
      execution_id = ARGV[2], probes = 1, last_probe_ms = tonumber(ARGV[3])}
    remember(KEYS[3], entry, ARGV[4], ARGV[5])
  end
  return {'probe', interval}
end
return {'open', redis.call('PTTL', KEYS[2])}
