local cutoff, max = tonumber(ARGV[1]), tonumber(ARGV[2])
local dropped = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local at = redis.call('ZSCORE', KEYS[1], id)
  if at and (tonumber(at) < cutoff or redis.call('ZCARD', KEYS[1]) > max) then
    drop(KEYS[1], KEYS[2], KEYS[3], KEYS[i + 1], id)
    dropped = dropped + 1
  end
end
return dropped
