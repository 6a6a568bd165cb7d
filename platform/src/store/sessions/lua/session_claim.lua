local held = {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}
for i = 1, 2 do
  if ARGV[i] ~= '' and held[i] and held[i] ~= ARGV[i] then return {held[1] or '', held[2] or ''} end
end
for i = 1, 2 do
  if ARGV[i] ~= '' then
    if not redis.call('SET', KEYS[i], ARGV[i], 'NX', 'EX', ARGV[3]) then
      redis.call('EXPIRE', KEYS[i], ARGV[3], 'GT')
    end
    held[i] = ARGV[i]
  elseif held[i] then
    redis.call('EXPIRE', KEYS[i], ARGV[3], 'GT')
  end
end
return {held[1] or '', held[2] or ''}
