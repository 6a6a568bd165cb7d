local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local buckets = {}
local function load(first)
  local n = tonumber(ARGV[first])
  for i = 0, n - 1 do
    local at = first + 1 + i * 4
    local b = {name = '~' .. ARGV[at], unit = ARGV[at + 1], interval = tonumber(ARGV[at + 2]), tol = tonumber(ARGV[at + 3])}
    b.tat = tonumber(redis.call('ZSCORE', KEYS[1], b.name) or now)
    buckets[#buckets + 1] = b
  end
end
local function cost(b, tokens) if b.unit == 'tokens' then return tokens end return 1 end
local function save()
  for _, b in ipairs(buckets) do redis.call('ZADD', KEYS[1], string.format('%.3f', b.tat), b.name) end
end
local function keep(grace)
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] then
    local at = math.ceil(tonumber(last[2]) + grace)
    redis.call('PEXPIREAT', KEYS[1], at)
    redis.call('PEXPIREAT', KEYS[2], at)
  end
end
