local r = redis.call('HMGET', KEYS[2], F.status, F.gen, F.step_round, F.step_attempt, F.step_poll, F.fence, F.owed,
  F.result, F.cancel_requested, F.owed_until, F.parked_step, F.parked_by, F.parked_until)
local status = r[1]
if not status then return {'missing'} end
local function num(v, d) return tonumber(v or '') or d end
local raw = redis.call('GET', KEYS[1])
local c = nil
if raw then c = cjson.decode(raw) end
local owed = r[7] or ''
if status == S.cancelled then return {'cancelled'} end
if status == S.dead_lettered or status == S.failed then return {'copy', 'ended'} end
local d = {tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])}
local e = {num(r[2], 0), num(r[3], 0), num(r[4], 1), num(r[5], 0)}
local earlier = false
for i = 1, 4 do
  if d[i] ~= e[i] then earlier = d[i] < e[i] break end
end
local done = status == S.succeeded or (c ~= nil and c.state == 'done')
if done or earlier then
  if owed ~= '' then
    -- The claim's holder, or another copy, may be carrying it out right now.
    if c and c.state == 'claimed' and num(c.lease_until, 0) > now then
      return {'busy', tostring(num(c.lease_until, 0) - now)}
    end
    if num(r[10], 0) > now then return {'busy', tostring(num(r[10], 0) - now)} end
    redis.call('HSET', KEYS[2], F.owed_until, now + tonumber(ARGV[2]))
    return {'owed', owed, r[8] or ''}
  end
  if done then return {'done', r[8] or '', raw or ''} end
  return {'copy', 'earlier'}
end
-- The step is parked, its parked delivery due back: any other delivery of it is a copy.
local parked = r[11] or ''
-- A cancel request lets any delivery in: it ends the step now rather than when it is due.
if ARGV[8] ~= 'take' and not r[9] and parked == table.concat(d, ':') and (r[12] or '') ~= ARGV[9]
  and now < num(r[13], 0) + tonumber(ARGV[10]) then
  return {'copy', 'parked'}
end
if ARGV[8] ~= 'take' and c and c.state == 'claimed' and num(c.lease_until, 0) > now then
  return {'busy', tostring(num(c.lease_until, 0) - now)}
end
local token = int(math.max(num(c and c.token, 0), num(r[6], 0)) + 1)
redis.call('SET', KEYS[1], '{"state":"claimed","token":' .. token .. ',"owner":' .. cjson.encode(ARGV[1])
  .. ',"lease_until":' .. int(now + tonumber(ARGV[2])) .. '}', 'EX', ARGV[3])
local f = {F.fence, token}
-- The step's fields only when they move (they read as these defaults while unwritten).
for i = 1, 4 do
  if d[i] ~= e[i] then
    for j, name in ipairs({F.gen, F.step_round, F.step_attempt, F.step_poll}) do f[#f + 1] = name; f[#f + 1] = ARGV[3 + j] end
    break
  end
end
-- This step arrived: whatever the record owed it (its publish) is done.
if owed ~= '' then f[#f + 1] = F.owed; f[#f + 1] = '' end
if ARGV[8] == 'run' then
  for _, v in ipairs({F.status, S.running, F.attempts, ARGV[6], F.updated_at_ms, int(now)}) do f[#f + 1] = v end
end
redis.call('HSET', KEYS[2], unpack(f))
-- Claimed: whatever was parked is running now, or parks again under this claim.
if parked ~= '' then redis.call('HDEL', KEYS[2], F.parked_step, F.parked_by, F.parked_until) end
outlive(KEYS[2], ARGV[3])
-- A turn's step reads its state with its claim (the state a newer claim would have to write after).
local state = KEYS[3] and redis.call('GET', KEYS[3]) or ''
return {'claimed', token, r[9] and '1' or '', state}
