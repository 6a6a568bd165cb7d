//! A tool's fleet-wide limits in Redis: the concurrency semaphore (a sorted set of holder → lease
//! expiry: acquire, renew, release) and the rate limiter (GCRA with reservations, one sorted set).
//! Each script touches its one key, so both work on Redis Cluster. Times are Redis's own clock
//! (`TIME`), so the workers' clocks need not agree.

use crate::store::script::Lua;
use std::time::Duration;

use redis::AsyncCommands;

use fleet_protocol::limits::RateLimit;

use super::Limits;
use crate::store::StoreError;

/// KEYS: the semaphore. ARGV: holder, limit, lease (ms). Expired leases (a worker that died) are
/// dropped first; a holder already in the set keeps its place. Answers {1} or {0, ms until the
/// earliest lease expires}.
const ACQUIRE_LUA: &str = include_str!("lua/acquire.lua");

/// KEYS: a tenant's turn semaphore, its line, the line's deadlines. ARGV: holder (the claim),
/// the turn, limit, lease (ms), recheck (ms). Slots go to the turns in line in their order: a turn
/// takes one if fewer stand before it than slots are free; else it keeps its place and asks again
/// later the further back it stands. A turn that stops asking is dropped from the head of the
/// line after three of its waits. Answers {1} or {0, ms to wait}.
const ACQUIRE_IN_LINE_LUA: &str = include_str!("lua/acquire_in_line.lua");

/// KEYS: the semaphore. ARGV: holder, lease (ms). Extends the holder's lease; 0 if it has none
/// any more (it expired and was dropped).
const RENEW_LUA: &str = include_str!("lua/renew.lua");

/// KEYS: the limiter. ARGV: the call's id, interval (ms), tolerance (ms), early (ms), grace (ms).
/// `protocol::limits::gcra_reserve` in one step: the member `~tat` holds the theoretical arrival
/// time; every other member is a call's reserved slot. A call holding a slot runs once its slot
/// has come (within `early`) and gives it up; a call without one gets the next slot: now, or a
/// reservation it comes back for. Reservations not used within `grace` of their time (a call that
/// was cancelled meanwhile) are dropped. Answers {1} (run now) or {0, ms to wait}.
const PACE_LUA: &str = include_str!("lua/pace.lua");

static ACQUIRE: Lua = Lua::new(|| crate::store::script::load(&[ACQUIRE_LUA]));
static ACQUIRE_IN_LINE: Lua = Lua::new(|| crate::store::script::load(&[ACQUIRE_IN_LINE_LUA]));
static RENEW: Lua = Lua::new(|| crate::store::script::load(&[RENEW_LUA]));
static PACE: Lua = Lua::new(|| crate::store::script::load(&[PACE_LUA]));

/// How long an unused reservation is kept after its time before it is dropped.
const RESERVATION_GRACE: Duration = Duration::from_secs(300);

/// What asking for one of a tool's concurrency slots found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotGrant {
    Acquired,
    /// Every slot is held; the earliest lease runs out in this long (if never renewed).
    Full {
        earliest_expiry: Duration,
    },
}

/// What the rate limiter says about a call now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    Now,
    /// Its slot is reserved this far ahead: come back then.
    Wait(Duration),
}

/// A fleet-wide concurrency semaphore: a tool's (`max_concurrency`) or a tenant's running turns
/// (`FLEET_TENANT_MAX_CONCURRENT_TURNS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Semaphore<'a> {
    Tool(&'a str),
    TenantTurns(&'a str),
}

impl Limits {
    fn semaphore_key(&self, semaphore: Semaphore<'_>) -> String {
        match semaphore {
            Semaphore::Tool(tool) => self.redis.keys.tool_concurrency(tool),
            Semaphore::TenantTurns(tenant) => self.redis.keys.tenant_turns(tenant),
        }
    }

    /// Takes one of the semaphore's `limit` slots for `holder`, leased for `lease`.
    pub async fn acquire_slot(
        &self,
        semaphore: Semaphore<'_>,
        holder: &str,
        limit: u32,
        lease: Duration,
    ) -> Result<SlotGrant, StoreError> {
        let r: Result<Vec<i64>, _> = ACQUIRE
            .key(self.semaphore_key(semaphore))
            .arg(holder)
            .arg(limit)
            .arg(lease.as_millis() as u64)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        match self.redis.count(r)?.as_slice() {
            [1, ..] => Ok(SlotGrant::Acquired),
            [0, ms] => Ok(SlotGrant::Full { earliest_expiry: Duration::from_millis((*ms).max(0) as u64) }),
            other => Err(StoreError::Corrupt(format!("the slot script answered {other:?}"))),
        }
    }

    /// Takes one of `tenant`'s `limit` turn slots for `holder` (the claim of a step of `turn`),
    /// leased for `lease`, in the order the tenant's turns asked; `Wait` keeps the turn's place.
    pub async fn acquire_turn_slot(
        &self,
        tenant: &str,
        holder: &str,
        turn: &str,
        limit: u32,
        lease: Duration,
        recheck: Duration,
    ) -> Result<Pace, StoreError> {
        let (line, due) = self.redis.keys.tenant_turns_line(tenant);
        let r: Result<Vec<i64>, _> = ACQUIRE_IN_LINE
            .key(self.redis.keys.tenant_turns(tenant))
            .key(line)
            .key(due)
            .arg(holder)
            .arg(turn)
            .arg(limit)
            .arg(lease.as_millis() as u64)
            .arg(recheck.as_millis() as u64)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        match self.redis.count(r)?.as_slice() {
            [1, ..] => Ok(Pace::Now),
            [0, ms] => Ok(Pace::Wait(Duration::from_millis((*ms).max(1) as u64))),
            other => Err(StoreError::Corrupt(format!("the turn slot script answered {other:?}"))),
        }
    }

    /// Extends `holder`'s lease; `false` if it had run out (and may have been given to another).
    pub async fn renew_slot(
        &self,
        semaphore: Semaphore<'_>,
        holder: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let r: Result<i64, _> = RENEW
            .key(self.semaphore_key(semaphore))
            .arg(holder)
            .arg(lease.as_millis() as u64)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)? == 1)
    }

    /// Gives `holder`'s slot back.
    pub async fn release_slot(&self, semaphore: Semaphore<'_>, holder: &str) -> Result<(), StoreError> {
        let r: Result<(), _> = self.redis.conn().await?.zrem(self.semaphore_key(semaphore), holder).await;
        self.redis.count(r)
    }

    /// Asks `tool`'s rate limiter whether `call` may run now; a call that must wait keeps the slot
    /// it was given and is let through when it asks again at that time. `early` is how much
    /// sooner than its slot a call may run (the broker's early returns and clock skew).
    pub async fn pace_tool(
        &self,
        tool: &str,
        call: &str,
        limit: &RateLimit,
        early: Duration,
    ) -> Result<Pace, StoreError> {
        let r: Result<Vec<i64>, _> = PACE
            .key(self.redis.keys.tool_rate(tool))
            .arg(call)
            .arg(limit.interval_ms())
            .arg(limit.tolerance_ms())
            .arg(early.as_millis() as u64)
            .arg(RESERVATION_GRACE.as_millis() as u64)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        match self.redis.count(r)?.as_slice() {
            [1, ..] => Ok(Pace::Now),
            [0, ms] => Ok(Pace::Wait(Duration::from_millis((*ms).max(1) as u64))),
            other => Err(StoreError::Corrupt(format!("the rate script answered {other:?}"))),
        }
    }
}
