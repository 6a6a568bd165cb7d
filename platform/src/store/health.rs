//! A tool's endpoint health and its circuit: one hash per tool (`tool-health:{name}`) with its
//! probe slot (`…:probe`) under the same hash tag, so every script here touches one slot and works
//! on Redis Cluster. The worker asks before a call (`admit_call`: run, probe, or wait) and reports
//! each attempt's endpoint signal (`record_signal`); operators read (`tool_health`) and close
//! (`close_circuit`). The open-circuit index (`open_circuits`) lives in another slot: it is written
//! after the hash, re-added on every failure while open, and checked entry by entry by its reader.

use std::time::Duration;

use fleet_protocol::circuit::{CircuitPolicy, Signal};

use super::{Store, StoreError};

// Built once: `Script::new` hashes its source.
static ADMIT_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| redis::Script::new(ADMIT_LUA));
static RECORD_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| redis::Script::new(RECORD_LUA));
static CLOSE_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| redis::Script::new(CLOSE_LUA));

/// Health is forgotten after this long without a call (the circuit with it).
const HEALTH_TTL_SECS: u64 = 30 * 24 * 60 * 60;

// KEYS: health, probe. ARGV: signal (up|down), now ms, threshold, probe interval ms, ttl.
// Answers what changed: opened, closed, open (a failure while open), counted.
const RECORD_LUA: &str = r#"
local state = redis.call('HGET', KEYS[1], 'state')
local answer = 'counted'
if ARGV[1] == 'up' then
  redis.call('HSET', KEYS[1], 'consecutive_failures', 0, 'last_success_ms', ARGV[2])
  if state == 'open' then
    redis.call('HSET', KEYS[1], 'state', 'closed', 'closed_at_ms', ARGV[2])
    redis.call('HDEL', KEYS[1], 'opened_at_ms')
    redis.call('DEL', KEYS[2])
    answer = 'closed'
  end
else
  local n = redis.call('HINCRBY', KEYS[1], 'consecutive_failures', 1)
  redis.call('HSET', KEYS[1], 'last_failure_ms', ARGV[2], 'probe_interval_ms', ARGV[4])
  local threshold = tonumber(ARGV[3])
  if state == 'open' then
    answer = 'open'
  elseif threshold > 0 and n >= threshold then
    redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at_ms', ARGV[2])
    -- The first probe comes one interval after opening.
    redis.call('SET', KEYS[2], 'opened', 'PX', ARGV[4])
    answer = 'opened'
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[5])
return answer
"#;

// KEYS: health, probe. ARGV: fallback probe interval ms, the caller's execution id.
// Answers {closed, 0}, {probe, interval ms} or {open, ms until the probe slot frees}.
const ADMIT_LUA: &str = r#"
if redis.call('HGET', KEYS[1], 'state') ~= 'open' then return {'closed', 0} end
local interval = tonumber(redis.call('HGET', KEYS[1], 'probe_interval_ms')) or tonumber(ARGV[1])
if redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', interval) then return {'probe', interval} end
return {'open', redis.call('PTTL', KEYS[2])}
"#;

// KEYS: health, probe. ARGV: now ms, ttl. Answers the state it had ('' if none).
const CLOSE_LUA: &str = r#"
local state = redis.call('HGET', KEYS[1], 'state')
redis.call('HSET', KEYS[1], 'state', 'closed', 'consecutive_failures', 0, 'closed_at_ms', ARGV[1])
redis.call('HDEL', KEYS[1], 'opened_at_ms')
redis.call('DEL', KEYS[2])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return state or ''
"#;

/// What the circuit lets a call do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Closed: call as usual.
    Call,
    /// Open, and this call holds the probe slot: call, and its signal decides.
    Probe,
    /// Open, the probe slot taken: ask again after `probe_free_in` (if known).
    Wait { probe_free_in: Option<Duration> },
}

/// What recording a signal changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Opened,
    Closed,
    /// A failure while already open.
    StillOpen,
    Unchanged,
}

/// A tool's health as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolHealth {
    pub open: bool,
    pub consecutive_failures: u64,
    pub last_success_ms: Option<i64>,
    pub last_failure_ms: Option<i64>,
    pub opened_at_ms: Option<i64>,
}

impl Store {
    /// Asks the circuit of `tool` whether a call may go now (see `ADMIT_LUA`).
    pub async fn admit_call(
        &self,
        tool: &str,
        execution_id: &str,
        fallback_interval: Duration,
    ) -> Result<Admission, StoreError> {
        let r: Result<(String, i64), _> = ADMIT_SCRIPT
            .key(self.keys.tool_health(tool))
            .key(self.keys.tool_probe(tool))
            .arg(fallback_interval.as_millis() as u64)
            .arg(execution_id)
            .invoke_async(&mut self.conn().await?)
            .await;
        let (verdict, ms) = self.count(r)?;
        Ok(match verdict.as_str() {
            "closed" => Admission::Call,
            "probe" => Admission::Probe,
            // PTTL answers -1/-2 for a key without expiry or gone: unknown.
            _ => Admission::Wait { probe_free_in: (ms > 0).then(|| Duration::from_millis(ms as u64)) },
        })
    }

    /// Records one attempt's endpoint signal under `policy`; an `Unknown` signal records nothing.
    pub async fn record_signal(
        &self,
        tool: &str,
        signal: Signal,
        policy: CircuitPolicy,
        now_ms: i64,
    ) -> Result<Transition, StoreError> {
        let word = match signal {
            Signal::Up => "up",
            Signal::Down => "down",
            Signal::Unknown => return Ok(Transition::Unchanged),
        };
        let r: Result<String, _> = RECORD_SCRIPT
            .key(self.keys.tool_health(tool))
            .key(self.keys.tool_probe(tool))
            .arg(word)
            .arg(now_ms)
            .arg(policy.failure_threshold)
            .arg(policy.probe_interval.as_millis().max(1) as u64)
            .arg(HEALTH_TTL_SECS)
            .invoke_async(&mut self.conn().await?)
            .await;
        let transition = match self.count(r)?.as_str() {
            "opened" => Transition::Opened,
            "closed" => Transition::Closed,
            "open" => Transition::StillOpen,
            _ => Transition::Unchanged,
        };
        match transition {
            Transition::Opened | Transition::StillOpen => self.index_open(tool, true, now_ms).await,
            Transition::Closed => self.index_open(tool, false, now_ms).await,
            Transition::Unchanged => {}
        }
        Ok(transition)
    }

    /// Closes the circuit of `tool` by hand (its consecutive failures reset); answers whether it
    /// was open.
    pub async fn close_circuit(&self, tool: &str, now_ms: i64) -> Result<bool, StoreError> {
        let r: Result<String, _> = CLOSE_SCRIPT
            .key(self.keys.tool_health(tool))
            .key(self.keys.tool_probe(tool))
            .arg(now_ms)
            .arg(HEALTH_TTL_SECS)
            .invoke_async(&mut self.conn().await?)
            .await;
        let was_open = self.count(r)? == "open";
        self.index_open(tool, false, now_ms).await;
        Ok(was_open)
    }

    /// The health of `tool` (all empty for a tool never called).
    pub async fn tool_health(&self, tool: &str) -> Result<ToolHealth, StoreError> {
        let r: Result<std::collections::HashMap<String, String>, _> =
            redis::cmd("HGETALL").arg(self.keys.tool_health(tool)).query_async(&mut self.conn().await?).await;
        let hash = self.count(r)?;
        let number = |name: &str| hash.get(name).and_then(|v| v.parse::<i64>().ok());
        Ok(ToolHealth {
            open: hash.get("state").is_some_and(|s| s == "open"),
            consecutive_failures: number("consecutive_failures").unwrap_or(0).max(0) as u64,
            last_success_ms: number("last_success_ms"),
            last_failure_ms: number("last_failure_ms"),
            opened_at_ms: number("opened_at_ms"),
        })
    }

    /// Tools the open-circuit index names (each to be checked against its health: the index is
    /// written after the hash and may lag it).
    pub async fn open_circuits(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        let r: Result<Vec<String>, _> = redis::cmd("ZRANGE")
            .arg(self.keys.open_circuits())
            .arg(0)
            .arg(limit.saturating_sub(1))
            .query_async(&mut self.conn().await?)
            .await;
        self.count(r)
    }

    /// Drops `tool` from the open-circuit index (its reader found it closed).
    pub async fn forget_open_circuit(&self, tool: &str) -> Result<(), StoreError> {
        let r: Result<i64, _> =
            redis::cmd("ZREM").arg(self.keys.open_circuits()).arg(tool).query_async(&mut self.conn().await?).await;
        self.count(r).map(|_| ())
    }

    /// Best effort: the hash is the truth; a missed write here is repaired by the next failure
    /// while open (re-added) or by the reader (removed).
    async fn index_open(&self, tool: &str, open: bool, now_ms: i64) {
        let Ok(mut conn) = self.conn().await else { return };
        let key = self.keys.open_circuits();
        let r: Result<i64, _> = if open {
            redis::cmd("ZADD").arg(&key).arg("NX").arg(now_ms).arg(tool).query_async(&mut conn).await
        } else {
            redis::cmd("ZREM").arg(&key).arg(tool).query_async(&mut conn).await
        };
        if let Err(e) = r {
            self.metrics.redis_errors.inc();
            tracing::debug!(error = %e, tool, "open-circuit index not updated");
        }
    }
}
