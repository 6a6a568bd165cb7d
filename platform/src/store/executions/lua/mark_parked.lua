local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local c = cjson.decode(raw)
if c.state == 'claimed' or tonumber(c.token) ~= tonumber(ARGV[1]) then return 0 end
local r = redis.call('HMGET', KEYS[2], F.status, F.gen, F.step_round, F.step_attempt, F.step_poll)
local status = r[1]
if not status or status == S.succeeded or status == S.failed or status == S.dead_lettered
  or status == S.cancelled then return 0 end
local function num(v, d) return tonumber(v or '') or d end
local e = {num(r[2], 0), num(r[3], 0), num(r[4], 1), num(r[5], 0)}
for i = 1, 4 do
  if e[i] ~= tonumber(ARGV[i + 1]) then return 0 end
end
redis.call('HSET', KEYS[2], F.parked_step, table.concat(e, ':'), F.parked_by, ARGV[1], F.parked_until, ARGV[6])
return 1
