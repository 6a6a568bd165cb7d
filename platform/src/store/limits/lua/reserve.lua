local id, tokens = ARGV[1], tonumber(ARGV[2])
local early, grace, now_only = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == '1'
local tenant, weight, class, light = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8]), 1 - tonumber(ARGV[9])
local fair, line, seen, waiting, placed = KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
-- Each tenant's waiters and places live in two shared sets ordered by name (every score 0), a
-- tenant's entries under its prefix `tenant|`: a waiter `tenant|order|id`, a place
-- `tenant|start|seq`, numbers padded so the names sort as the numbers do.
local function first(t) return '[' .. t .. '|' end
local function past(t) return '(' .. t .. '}' end
local function count(set, t) return redis.call('ZLEXCOUNT', set, first(t), past(t)) end
local function nth(set, t, rank)
  if rank < 0 then return redis.call('ZRANGE', set, past(t), first(t), 'BYLEX', 'REV', 'LIMIT', -rank - 1, 1)[1] end
  return redis.call('ZRANGE', set, first(t), past(t), 'BYLEX', 'LIMIT', rank, 1)[1]
end
local function waiter_of(w) return redis.call('HGET', fair, 'w|' .. w) end
local function rank_of(t, w)
  local m = waiter_of(w)
  if not m or not redis.call('ZSCORE', waiting, m) then return nil end
  return redis.call('ZLEXCOUNT', waiting, first(t), '(' .. m)
end
local function unwait(w)
  local m = waiter_of(w)
  if m then redis.call('ZREM', waiting, m) redis.call('HDEL', fair, 'w|' .. w) end
end
-- A place's start tag and its name in the line (`tenant|seq`).
local function place_parts(t, m)
  local start = string.sub(m, #t + 2, #t + 21)
  return tonumber(start), t .. '|' .. string.sub(m, #t + 23)
end
local function drop_place(t, rank)
  local m = nth(placed, t, rank)
  if m then
    local _, in_line = place_parts(t, m)
    redis.call('ZREM', placed, m)
    redis.call('ZREM', line, in_line)
  end
end
local function keep_for(keys, ms)
  for _, k in ipairs(keys) do
    if redis.call('PTTL', k) < ms then redis.call('PEXPIRE', k, math.ceil(ms)) end
  end
end
local gone = redis.call('ZRANGEBYSCORE', seen, '-inf', string.format('(%.3f', now), 'LIMIT', 0, 100)
for _, m in ipairs(gone) do
  local bar = string.find(m, '|', 1, true)
  local t, w = string.sub(m, 1, bar - 1), string.sub(m, bar + 1)
  redis.call('ZREM', seen, m)
  redis.call('HDEL', KEYS[2], w)
  unwait(w)
  local places = count(placed, t)
  if places > count(waiting, t) then
    drop_place(t, -1)
  elseif places == 0 then
    -- The tenant's keys ran out before its places in the line did: drop one by its name.
    local found = redis.call('ZSCAN', line, 0, 'MATCH', t .. '|*', 'COUNT', 1000)[2]
    if found[1] then redis.call('ZREM', line, found[1]) end
  end
end
local me = tenant .. '|' .. id
local paused = tonumber(redis.call('ZSCORE', KEYS[1], '~paused') or 0)
if paused > now + early then
  if waiter_of(id) then
    redis.call('ZADD', seen, string.format('%.3f', paused + grace), me)
  end
  return {0, math.ceil(paused - now), 1}
end
load(10)
if #buckets == 0 then return {1, tokens, 0} end
local cost_ms = 0
for _, b in ipairs(buckets) do cost_ms = math.max(cost_ms, cost(b, tokens) * b.interval) end
local use = tonumber(redis.call('HGET', fair, 'u|' .. tenant) or now)
local heavy = math.max(use, now) - now >= buckets[1].tol * light
local function short(calls)
  local worst = 0
  for _, b in ipairs(buckets) do
    local tol = b.tol
    if heavy then tol = tol * light end
    local need = math.max(math.min(cost(b, tokens) * b.interval, tol), 1e-9)
    worst = math.max(worst, calls * need - (now + early + tol - math.max(b.tat, now)))
  end
  return worst
end
local rank = rank_of(tenant, id)
local ahead, mine
if now_only then
  ahead = redis.call('ZCARD', line)
else
  if not rank then
    local v = tonumber(redis.call('HGET', fair, '~v') or 0)
    local start = math.max(v, tonumber(redis.call('HGET', fair, 'f|' .. tenant) or v))
    redis.call('HSET', fair, 'f|' .. tenant, string.format('%.3f', start + cost_ms / weight))
    local seq = redis.call('HINCRBY', fair, '~seq', 1)
    local place = tenant .. '|' .. seq
    redis.call('ZADD', placed, 0, string.format('%s|%020.3f|%d', tenant, start, seq))
    redis.call('ZADD', line, string.format('%.3f', start), place)
    local waiter = string.format('%s|%017.0f|%s', tenant, class * 1099511627776 + seq, id)
    redis.call('ZADD', waiting, 0, waiter)
    redis.call('HSET', fair, 'w|' .. id, waiter)
    redis.call('HSET', KEYS[2], id, tokens)
    rank = rank_of(tenant, id)
  end
  local m = nth(placed, tenant, rank) or nth(placed, tenant, -1)
  mine = {}
  if m then mine[1] = m mine[2] = place_parts(tenant, m) end
  if heavy then
    ahead = redis.call('ZCOUNT', line, '-inf', string.format('(%.3f', mine[2]))
  else
    -- Runs from the reserve, which heavy users' places cannot use: only its own places count.
    ahead = redis.call('ZLEXCOUNT', placed, first(tenant), string.format('(%s|%020.3f', tenant, mine[2]))
  end
end
local wait = short(ahead + 1)
if wait > 0 then
  wait = math.max(math.ceil(wait), 1)
  if not now_only then
    redis.call('ZADD', seen, string.format('%.3f', now + 2 * wait + grace), me)
    keep_for({fair, line, seen, KEYS[2], waiting, placed}, 2 * wait + grace + 60000)
  end
  return {0, wait, 0}
end
if not now_only then
  -- The place it was counted from: the line's virtual time moves to it, and it is given up.
  if mine[2] then
    local v = tonumber(redis.call('HGET', fair, '~v') or 0)
    redis.call('HSET', fair, '~v', string.format('%.3f', math.max(v, mine[2])))
    drop_place(tenant, rank)
  end
  unwait(id)
  redis.call('ZREM', seen, me)
  redis.call('HDEL', KEYS[2], id)
end
redis.call('HSET', fair, 'u|' .. tenant, string.format('%.3f', math.max(use, now) + cost_ms))
local last = now
for _, b in ipairs(buckets) do
  b.tat = math.max(b.tat, now) + cost(b, tokens) * b.interval
  last = math.max(last, b.tat)
end
save()
keep_for({KEYS[1], fair, line, seen, KEYS[2]}, last - now + grace + 60000)
return {1, tokens, 0}
