//! A model provider's fleet-wide budget in Redis: its buckets (requests and tokens per minute, the
//! provider's and a configured model's) as GCRA arrival times and the pause a 429 sets, in one
//! sorted set; the steps waiting for it in a fair line across tenants (`fleet_protocol::fair`
//! holds the decisions as plain functions). Every key shares the provider's hash tag, so every
//! script works on Redis Cluster. Times are Redis's own clock (`TIME`), so the workers' clocks
//! need not agree.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use fleet_protocol::budget::{Bucket, ProviderLimits};
use fleet_protocol::fair::Priority;

use super::{Store, StoreError};

/// The part every budget script shares: the clock, the buckets (ARGV from `first`, four each:
/// name, unit, interval, tolerance), `save` (every bucket's new arrival time) and `keep` (the
/// budget's keys live as long as their last score).
const COMMON_LUA: &str = r#"
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
"#;

/// KEYS: the budget, its costs, its fair state, its line, the waiters' deadlines. A heavy user's
/// step needs room for every place ahead of its own in the line; any other tenant's, for its own
/// places ahead (`fair::places_ahead`). ARGV: the step's
/// id, its tokens, early (ms), grace (ms), now-only (1: run only if the budget has room now for
/// everyone waiting and this step; join no line), the tenant, its weight, its priority class, the
/// light tenants' reserve, then the buckets. `fleet_protocol::fair` holds each decision as a plain function: `place` (the start
/// tag), `heavy`/`tolerance_for`, `Room` and `admit`. A step that does not run keeps its place and
/// is given up for gone (its place dropped) if it does not ask again within twice its wait and
/// `grace`. Answers {1, tokens reserved} (run now) or {0, ms to wait, 1 if the provider is paused}.
const RESERVE_LUA: &str = r#"
local id, tokens = ARGV[1], tonumber(ARGV[2])
local early, grace, now_only = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == '1'
local tenant, weight, class, light = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8]), 1 - tonumber(ARGV[9])
local fair, line, seen = KEYS[3], KEYS[4], KEYS[5]
local function waiters(t) return fair .. ':w:' .. t end
local function places(t) return fair .. ':p:' .. t end
local function drop_place(t, rank)
  local m = redis.call('ZRANGE', places(t), rank, rank)[1]
  if m then redis.call('ZREM', places(t), m) redis.call('ZREM', line, m) end
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
  redis.call('ZREM', waiters(t), w)
  if redis.call('ZCARD', places(t)) > redis.call('ZCARD', waiters(t)) then
    drop_place(t, -1)
  elseif redis.call('EXISTS', places(t)) == 0 then
    -- The tenant's keys ran out before its places in the line did: drop one by its name.
    local found = redis.call('ZSCAN', line, 0, 'MATCH', t .. '|*', 'COUNT', 1000)[2]
    if found[1] then redis.call('ZREM', line, found[1]) end
  end
end
local me = tenant .. '|' .. id
local paused = tonumber(redis.call('ZSCORE', KEYS[1], '~paused') or 0)
if paused > now + early then
  if redis.call('ZSCORE', waiters(tenant), id) then
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
local rank = redis.call('ZRANK', waiters(tenant), id)
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
    redis.call('ZADD', places(tenant), string.format('%.3f', start), place)
    redis.call('ZADD', line, string.format('%.3f', start), place)
    redis.call('ZADD', waiters(tenant), class * 1099511627776 + seq, id)
    redis.call('HSET', KEYS[2], id, tokens)
    rank = redis.call('ZRANK', waiters(tenant), id)
  end
  mine = redis.call('ZRANGE', places(tenant), rank, rank, 'WITHSCORES')
  if not mine[2] then
    mine = redis.call('ZRANGE', places(tenant), -1, -1, 'WITHSCORES')
  end
  if heavy then
    ahead = redis.call('ZCOUNT', line, '-inf', '(' .. mine[2])
  else
    -- Runs from the reserve, which heavy users' places cannot use: only its own places count.
    ahead = redis.call('ZCOUNT', places(tenant), '-inf', '(' .. mine[2])
  end
end
local wait = short(ahead + 1)
if wait > 0 then
  wait = math.max(math.ceil(wait), 1)
  if not now_only then
    redis.call('ZADD', seen, string.format('%.3f', now + 2 * wait + grace), me)
    keep_for({fair, line, seen, KEYS[2], waiters(tenant), places(tenant)}, 2 * wait + grace + 60000)
  end
  return {0, wait, 0}
end
if not now_only then
  -- The place it was counted from: the line's virtual time moves to it, and it is given up.
  if mine[2] then
    local v = tonumber(redis.call('HGET', fair, '~v') or 0)
    redis.call('HSET', fair, '~v', string.format('%.3f', math.max(v, tonumber(mine[2]))))
    drop_place(tenant, rank)
  end
  redis.call('ZREM', waiters(tenant), id)
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
"#;

/// KEYS: the budget, its costs. ARGV: tokens used less tokens reserved, the provider's remaining
/// requests and tokens (-1: not said), grace (ms), then the buckets. Token buckets take the
/// difference (a refund never below now); a provider saying fewer remain than a bucket's burst
/// allows moves that bucket's arrival time up to match (only ever tighter).
const SETTLE_LUA: &str = r#"
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
"#;

/// KEYS: the budget, its costs. ARGV: the pause (ms), grace (ms), then the buckets. The provider
/// takes nothing until the pause ends and starts from empty then (no burst): the waiting steps
/// keep their places in the line and run after it in their order.
const PAUSE_LUA: &str = r#"
local pause, grace = tonumber(ARGV[1]), tonumber(ARGV[2])
local paused = math.max(now + pause, tonumber(redis.call('ZSCORE', KEYS[1], '~paused') or 0))
redis.call('ZADD', KEYS[1], string.format('%.3f', paused), '~paused')
load(3)
for _, b in ipairs(buckets) do b.tat = math.max(b.tat, paused + b.tol) end
save()
keep(grace)
return math.ceil(paused - now)
"#;

static RESERVE: LazyLock<Script> = LazyLock::new(|| Script::new(&format!("{COMMON_LUA}{RESERVE_LUA}")));
static SETTLE: LazyLock<Script> = LazyLock::new(|| Script::new(&format!("{COMMON_LUA}{SETTLE_LUA}")));
static PAUSE: LazyLock<Script> = LazyLock::new(|| Script::new(&format!("{COMMON_LUA}{PAUSE_LUA}")));

/// How long a waiting step that does not ask again is kept in the line after twice its wait
/// (its turn was cancelled or its worker lost): a place kept for a step that is gone costs every
/// later step one call's worth of the burst until then.
const WAITER_GRACE: Duration = Duration::from_secs(30);

/// How long the budget's arrival times and the pause are kept after their last score.
const RESERVATION_GRACE: Duration = Duration::from_secs(300);

/// Who a step waits as in its provider's fair line.
#[derive(Debug, Clone, Copy)]
pub struct Waiter<'a> {
    /// One per step and attempt, so a parked step finds its place again.
    pub id: &'a str,
    pub tenant: &'a str,
    pub weight: u32,
    pub priority: Priority,
}

/// What a provider's budget says about a model call now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// Run now; this many tokens are reserved for it (settled after the call).
    Now { reserved: u64 },
    /// Its place in the line may come this far ahead (kept, unless asked for now only): come
    /// back then.
    Wait(Duration),
    /// The provider is paused by a 429 for this long more.
    Paused(Duration),
}

fn bucket_args(invocation: &mut redis::ScriptInvocation<'_>, buckets: &[Bucket]) {
    invocation.arg(buckets.len());
    for b in buckets {
        invocation.arg(&b.name).arg(b.unit.label()).arg(b.interval_ms).arg(b.tolerance_ms);
    }
}

impl Store {
    /// Spends `tokens` (and one request) from `provider`'s `buckets` for the step `waiter` now, or
    /// places it in the provider's fair line and answers how long until its place might come.
    /// `early` is how much sooner a step may run (the broker's early returns and clock skew).
    /// `now_only`: run only if the budget has room for everyone waiting too; join no line.
    pub async fn budget_reserve(
        &self,
        provider: &str,
        buckets: &[Bucket],
        waiter: Waiter<'_>,
        tokens: u64,
        early: Duration,
        now_only: bool,
    ) -> Result<Spend, StoreError> {
        let mut invocation = RESERVE.prepare_invoke();
        invocation
            .key(self.keys.llm_budget(provider))
            .key(self.keys.llm_budget_costs(provider))
            .key(self.keys.llm_budget_fair(provider))
            .key(self.keys.llm_budget_line(provider))
            .key(self.keys.llm_budget_seen(provider))
            .arg(waiter.id)
            .arg(tokens)
            .arg(early.as_millis() as u64)
            .arg(WAITER_GRACE.as_millis() as u64)
            .arg(u8::from(now_only))
            .arg(waiter.tenant)
            .arg(waiter.weight.max(1))
            .arg(waiter.priority.class())
            .arg(fleet_protocol::fair::LIGHT_RESERVE);
        bucket_args(&mut invocation, buckets);
        let r: Result<Vec<i64>, _> = invocation.invoke_async(&mut self.conn().await?).await;
        let ms = |n: i64| Duration::from_millis(n.max(1) as u64);
        match self.count(r)?.as_slice() {
            [1, reserved, ..] => Ok(Spend::Now { reserved: (*reserved).max(0) as u64 }),
            [0, wait, 0] => Ok(Spend::Wait(ms(*wait))),
            [0, wait, 1] => Ok(Spend::Paused(ms(*wait))),
            other => Err(StoreError::Corrupt(format!("the budget script answered {other:?}"))),
        }
    }

    /// Settles a call: `used` tokens against the `reserved` ones, and what the provider said of
    /// its remaining limits.
    pub async fn budget_settle(
        &self,
        provider: &str,
        buckets: &[Bucket],
        reserved: u64,
        used: u64,
        limits: &ProviderLimits,
    ) -> Result<(), StoreError> {
        let said = |n: Option<u64>| n.map_or(-1, |n| n.min(i64::MAX as u64) as i64);
        let mut invocation = SETTLE.prepare_invoke();
        invocation
            .key(self.keys.llm_budget(provider))
            .key(self.keys.llm_budget_costs(provider))
            .arg(used as i64 - reserved as i64)
            .arg(said(limits.remaining_requests))
            .arg(said(limits.remaining_tokens))
            .arg(RESERVATION_GRACE.as_millis() as u64);
        bucket_args(&mut invocation, buckets);
        let r: Result<i64, _> = invocation.invoke_async(&mut self.conn().await?).await;
        self.count(r).map(|_| ())
    }

    /// Pauses `provider` fleet-wide for `pause` (its 429): no step calls it meanwhile, and its
    /// budget starts from empty after. Answers how long the pause now lasts.
    pub async fn budget_pause(
        &self,
        provider: &str,
        buckets: &[Bucket],
        pause: Duration,
    ) -> Result<Duration, StoreError> {
        let mut invocation = PAUSE.prepare_invoke();
        invocation
            .key(self.keys.llm_budget(provider))
            .key(self.keys.llm_budget_costs(provider))
            .arg(pause.as_millis() as u64)
            .arg(RESERVATION_GRACE.as_millis() as u64);
        bucket_args(&mut invocation, buckets);
        let r: Result<i64, _> = invocation.invoke_async(&mut self.conn().await?).await;
        Ok(Duration::from_millis(self.count(r)?.max(0) as u64))
    }
}
