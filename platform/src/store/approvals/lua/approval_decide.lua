-- Decides an approval, only from the state it must be in: KEYS[1] its hash. ARGV[1] that state
-- (pending), ARGV[2] the state decided, ARGV[3] who decided, when and why (JSON). Answers `taken`,
-- `missing`, or the state it is in (a copy of a decision, or a conflicting one, changes nothing).
local now = redis.call('HGET', KEYS[1], 'state')
if not now then
  return 'missing'
end
if now ~= ARGV[1] then
  return now
end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'decided', ARGV[3])
return 'taken'
