//! A model provider's fleet-wide budget in Redis: its buckets (requests and tokens per minute, the
//! provider's and a configured model's) as GCRA arrival times with reservations, and the pause a
//! 429 sets, in one sorted set; the tokens each waiting step reserved in a hash beside it (the
//! same hash tag, so every script works on Redis Cluster). `protocol::budget::reserve` is the
//! reference model. Times are Redis's own clock (`TIME`), so the workers' clocks need not agree.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use fleet_protocol::budget::{Bucket, ProviderLimits};

use super::{Store, StoreError};

/// The part every budget script shares: the clock, the buckets (ARGV from `first`, four each:
/// name, unit, interval, tolerance), `place` (the GCRA over all buckets from a time on, writing
/// every bucket's new arrival time) and `keep` (the keys live as long as their last score).
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
local function place(tokens, from)
  local slot = from
  for _, b in ipairs(buckets) do slot = math.max(slot, math.max(b.tat, from) + cost(b, tokens) * b.interval - b.tol) end
  for _, b in ipairs(buckets) do b.tat = math.max(b.tat, slot) + cost(b, tokens) * b.interval end
  return slot
end
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

/// KEYS: the budget, its costs. ARGV: the step's id, its tokens, early (ms), grace (ms), now-only
/// (1: take a slot only if it is now, reserve nothing), then the buckets. Reservations not used
/// within `grace` of their time are dropped. Answers {1, tokens reserved} (run now) or
/// {0, ms to wait, 1 if the provider is paused}.
const RESERVE_LUA: &str = r#"
local id, tokens = ARGV[1], tonumber(ARGV[2])
local early, grace, now_only = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == '1'
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('(%.3f', now - grace), 'LIMIT', 0, 100)
for _, m in ipairs(old) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('HDEL', KEYS[2], m)
end
local paused = tonumber(redis.call('ZSCORE', KEYS[1], '~paused') or 0)
local mine = redis.call('ZSCORE', KEYS[1], id)
if mine then
  local due = math.max(tonumber(mine), paused)
  if due > now + early then
    local p = 0
    if due == paused then p = 1 end
    return {0, math.ceil(due - now), p}
  end
  local reserved = tonumber(redis.call('HGET', KEYS[2], id) or tokens)
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  return {1, reserved, 0}
end
if paused > now + early then return {0, math.ceil(paused - now), 1} end
load(6)
local slot = place(tokens, now)
if slot > now + early then
  if now_only then return {0, math.ceil(slot - now), 0} end
  redis.call('ZADD', KEYS[1], string.format('%.3f', slot), id)
  redis.call('HSET', KEYS[2], id, tokens)
  save()
  keep(grace)
  return {0, math.ceil(slot - now), 0}
end
save()
keep(grace)
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
/// takes nothing until the pause ends and starts from empty then; slots reserved before the
/// pause that would fall inside it are placed again after it, in their order.
const PAUSE_LUA: &str = r#"
local pause, grace = tonumber(ARGV[1]), tonumber(ARGV[2])
local paused = math.max(now + pause, tonumber(redis.call('ZSCORE', KEYS[1], '~paused') or 0))
redis.call('ZADD', KEYS[1], string.format('%.3f', paused), '~paused')
load(3)
for _, b in ipairs(buckets) do b.tat = math.max(b.tat, paused + b.tol) end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('%.3f', now - grace), string.format('(%.3f', paused), 'LIMIT', 0, 1000)
for _, m in ipairs(due) do
  if string.sub(m, 1, 1) ~= '~' then
    local tokens = tonumber(redis.call('HGET', KEYS[2], m) or 0)
    redis.call('ZADD', KEYS[1], string.format('%.3f', place(tokens, paused)), m)
  end
end
save()
keep(grace)
return math.ceil(paused - now)
"#;

static RESERVE: LazyLock<Script> = LazyLock::new(|| Script::new(&format!("{COMMON_LUA}{RESERVE_LUA}")));
static SETTLE: LazyLock<Script> = LazyLock::new(|| Script::new(&format!("{COMMON_LUA}{SETTLE_LUA}")));
static PAUSE: LazyLock<Script> = LazyLock::new(|| Script::new(&format!("{COMMON_LUA}{PAUSE_LUA}")));

/// How long an unused reservation is kept after its time before it is dropped (its step was
/// cancelled or its turn ended meanwhile).
const RESERVATION_GRACE: Duration = Duration::from_secs(300);

/// What a provider's budget says about a model call now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// Run now; this many tokens are reserved for it (settled after the call).
    Now { reserved: u64 },
    /// Its slot is this far ahead (reserved, unless asked for now only): come back then.
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
    /// Reserves `tokens` (and one request) from `provider`'s `buckets` for the step `id`: a step
    /// that must wait keeps its slot and runs when it asks again at that time. `early` is how much
    /// sooner than its slot a step may run (the broker's early returns and clock skew).
    pub async fn budget_reserve(
        &self,
        provider: &str,
        buckets: &[Bucket],
        id: &str,
        tokens: u64,
        early: Duration,
        now_only: bool,
    ) -> Result<Spend, StoreError> {
        let mut invocation = RESERVE.prepare_invoke();
        invocation
            .key(self.keys.llm_budget(provider))
            .key(self.keys.llm_budget_costs(provider))
            .arg(id)
            .arg(tokens)
            .arg(early.as_millis() as u64)
            .arg(RESERVATION_GRACE.as_millis() as u64)
            .arg(u8::from(now_only));
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
