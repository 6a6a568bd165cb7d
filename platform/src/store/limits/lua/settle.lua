local delta, grace = tonumber(ARGV[1]), tonumber(ARGV[4])
local remaining = {requests = tonumber(ARGV[2]), tokens = tonumber(ARGV[3])}
load(5)
for _, b in ipairs(buckets) do
  b.tat = math.max(b.tat, now)
  if b.unit == 'tokens' then b.tat = math.max(b.tat + delta * b.interval, now) end
  local r = remaining[b.unit]
  if r >= 0 and (b.name == '~req' or b.name == '~tok') then b.tat = math.max(b.tat, now + b.tol - r * b.interval) end
end
save()
keep(grace)
return 1
