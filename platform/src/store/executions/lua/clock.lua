local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function int(n) return string.format('%d', n) end
-- Keeps `key` alive at least `ttl` seconds; answers how long it lives now. A key without a TTL
-- (GT leaves it alone) gets one, as a TTL check did before.
local function outlive(key, ttl)
  if redis.call('EXPIRE', key, ttl, 'GT') == 1 then return tonumber(ttl) end
  local left = redis.call('TTL', key)
  if left == -1 then redis.call('EXPIRE', key, ttl) return tonumber(ttl) end
  return math.max(left, tonumber(ttl))
end
