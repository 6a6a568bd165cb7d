//! A model provider's fleet-wide budget in Redis: its buckets (requests and tokens per minute, the
//! provider's and a configured model's) as GCRA arrival times and the pause a 429 sets, in one
//! sorted set; the steps waiting for it in a fair line across tenants (`fleet_protocol::fair`
//! holds the decisions as plain functions). Every key shares the provider's hash tag, so every
//! script works on Redis Cluster. Times are Redis's own clock (`TIME`), so the workers' clocks
//! need not agree.

use crate::store::script::Lua;
use std::time::Duration;

use fleet_protocol::budget::{Bucket, ProviderLimits};
use fleet_protocol::fair::Priority;

use super::Limits;
use crate::store::StoreError;

/// The part every budget script shares: the clock, the buckets (ARGV from `first`, four each:
/// name, unit, interval, tolerance), `save` (every bucket's new arrival time) and `keep` (the
/// budget's keys live as long as their last score).
const COMMON_LUA: &str = include_str!("lua/common.lua");

/// KEYS: the budget, its costs, its fair state, its line, the waiters' deadlines, each tenant's
/// waiters, each tenant's places. A heavy user's
/// step needs room for every place ahead of its own in the line; any other tenant's, for its own
/// places ahead (`fair::places_ahead`). ARGV: the step's
/// id, its tokens, early (ms), grace (ms), now-only (1: run only if the budget has room now for
/// everyone waiting and this step; join no line), the tenant, its weight, its priority class, the
/// light tenants' reserve, then the buckets. `fleet_protocol::fair` holds each decision as a plain function: `place` (the start
/// tag), `heavy`/`tolerance_for`, `Room` and `admit`. A step that does not run keeps its place and
/// is given up for gone (its place dropped) if it does not ask again within twice its wait and
/// `grace`. Answers {1, tokens reserved} (run now) or {0, ms to wait, 1 if the provider is paused}.
const RESERVE_LUA: &str = include_str!("lua/reserve.lua");

/// KEYS: the budget, its costs. ARGV: tokens used less tokens reserved, the provider's remaining
/// requests and tokens (-1: not said), grace (ms), then the buckets. Token buckets take the
/// difference (a refund never below now); a provider saying fewer remain than a bucket's burst
/// allows moves that bucket's arrival time up to match (only ever tighter).
const SETTLE_LUA: &str = include_str!("lua/settle.lua");

/// KEYS: the budget, its costs. ARGV: the pause (ms), grace (ms), then the buckets. The provider
/// takes nothing until the pause ends and starts from empty then (no burst): the waiting steps
/// keep their places in the line and run after it in their order.
const PAUSE_LUA: &str = include_str!("lua/pause.lua");

static RESERVE: Lua = Lua::new(|| crate::store::script::load(&[COMMON_LUA, RESERVE_LUA]));
static SETTLE: Lua = Lua::new(|| crate::store::script::load(&[COMMON_LUA, SETTLE_LUA]));
static PAUSE: Lua = Lua::new(|| crate::store::script::load(&[COMMON_LUA, PAUSE_LUA]));

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

impl Limits {
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
            .key(self.redis.keys.llm_budget(provider))
            .key(self.redis.keys.llm_budget_costs(provider))
            .key(self.redis.keys.llm_budget_fair(provider))
            .key(self.redis.keys.llm_budget_line(provider))
            .key(self.redis.keys.llm_budget_seen(provider))
            .key(self.redis.keys.llm_budget_waiters(provider))
            .key(self.redis.keys.llm_budget_places(provider))
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
        let r: Result<Vec<i64>, _> = invocation.invoke_async(&mut self.redis.conn().await?).await;
        let ms = |n: i64| Duration::from_millis(n.max(1) as u64);
        match self.redis.count(r)?.as_slice() {
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
            .key(self.redis.keys.llm_budget(provider))
            .key(self.redis.keys.llm_budget_costs(provider))
            .arg(used as i64 - reserved as i64)
            .arg(said(limits.remaining_requests))
            .arg(said(limits.remaining_tokens))
            .arg(RESERVATION_GRACE.as_millis() as u64);
        bucket_args(&mut invocation, buckets);
        let r: Result<i64, _> = invocation.invoke_async(&mut self.redis.conn().await?).await;
        self.redis.count(r).map(|_| ())
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
            .key(self.redis.keys.llm_budget(provider))
            .key(self.redis.keys.llm_budget_costs(provider))
            .arg(pause.as_millis() as u64)
            .arg(RESERVATION_GRACE.as_millis() as u64);
        bucket_args(&mut invocation, buckets);
        let r: Result<i64, _> = invocation.invoke_async(&mut self.redis.conn().await?).await;
        Ok(Duration::from_millis(self.redis.count(r)?.max(0) as u64))
    }
}
