//! A tool's endpoint health and its circuit: one hash per tool (`tool-health:{name}`) with its
//! probe slot (`…:probe`) and history (`…:history`) under the same hash tag, so every script here
//! touches one slot and works on Redis Cluster. The worker asks before a call (`admit_call`: run,
//! probe, or wait) and reports each attempt's endpoint signal (`record_signal`); operators read
//! (`tool_health`, `circuit_history`) and close (`close_circuit`). Each change of the circuit
//! (opened, half-opened by a probe, closed) joins its bounded history in the script that makes it.
//! The open-circuit index (`open_circuits`) lives in another slot: it is written after the hash,
//! re-added on every failure while open, and checked entry by entry by its reader.

use crate::store::script::Lua;
use std::time::Duration;

use fleet_protocol::circuit::{CircuitPolicy, Signal};

use super::Limits;
use crate::store::StoreError;

static ADMIT_SCRIPT: Lua = Lua::new(|| with_history(ADMIT_LUA));
static RECORD_SCRIPT: Lua = Lua::new(|| with_history(RECORD_LUA));
static CLOSE_SCRIPT: Lua = Lua::new(|| with_history(CLOSE_LUA));

fn with_history(body: &str) -> redis::Script {
    crate::store::script::load(&[REMEMBER_LUA, body])
}

/// Health is forgotten after this long without a call (the circuit with it).
const HEALTH_TTL_SECS: u64 = 30 * 24 * 60 * 60;

/// Lua: adds an entry to a circuit's history (newest first, at most `max`), living `ttl` s.
const REMEMBER_LUA: &str = include_str!("lua/remember.lua");

// KEYS: health, probe, history. ARGV: signal (up|down), now ms, threshold, probe interval ms,
// ttl, the attempt's error (why it opens), history max.
// Answers what changed: opened, closed, open (a failure while open), counted.
const RECORD_LUA: &str = include_str!("lua/record.lua");

// KEYS: health, probe, history. ARGV: fallback probe interval ms, the caller's execution id,
// now ms, history max, ttl. Answers {closed, 0}, {probe, interval ms} or {open, ms until the probe
// slot frees}. A probe half-opens the circuit: its history's head counts the probes in a row.
const ADMIT_LUA: &str = include_str!("lua/admit.lua");

// KEYS: health, probe, history. ARGV: now ms, ttl, who closes it, history max. Answers the
// state it had ('' if none); closing an open circuit is remembered with who did it.
const CLOSE_LUA: &str = include_str!("lua/close.lua");

/// The most entries a circuit's history keeps.
pub const CIRCUIT_HISTORY_MAX: usize = 50;

/// One change of a tool's circuit, as its history keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CircuitEvent {
    pub at_ms: i64,
    /// `open`, `half_open` or `closed`.
    pub state: String,
    pub why: String,
    /// Who closed it (an operator's actor), if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// A half-opening: the probe call let through (the latest), how many in a row, the latest's time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_ms: Option<i64>,
}

/// What the circuit lets a call do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitAdmission {
    /// Closed: call as usual.
    Call,
    /// Open, and this call holds the probe slot: call, and its signal decides.
    Probe,
    /// Open, the probe slot taken: ask again after `probe_free_in` (if known).
    Wait { probe_free_in: Option<Duration> },
}

/// What recording a signal changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitChange {
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

impl Limits {
    /// Asks the circuit of `tool` whether a call may go now (see `ADMIT_LUA`).
    pub async fn admit_call(
        &self,
        tool: &str,
        execution_id: &str,
        fallback_interval: Duration,
    ) -> Result<CircuitAdmission, StoreError> {
        let r: Result<(String, i64), _> = ADMIT_SCRIPT
            .key(self.redis.keys.tool_health(tool))
            .key(self.redis.keys.tool_probe(tool))
            .key(self.redis.keys.tool_circuit_history(tool))
            .arg(fallback_interval.as_millis() as u64)
            .arg(execution_id)
            .arg(crate::now_ms())
            .arg(CIRCUIT_HISTORY_MAX)
            .arg(HEALTH_TTL_SECS)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        let (verdict, ms) = self.redis.count(r)?;
        Ok(match verdict.as_str() {
            "closed" => CircuitAdmission::Call,
            "probe" => CircuitAdmission::Probe,
            _ => CircuitAdmission::Wait { probe_free_in: probe_free_in(ms) },
        })
    }

    /// Records one attempt's endpoint signal under `policy`; an `Unknown` signal records nothing.
    /// `error` (the attempt's, sanitised) is what the history says opened the circuit.
    pub async fn record_signal(
        &self,
        tool: &str,
        signal: Signal,
        policy: CircuitPolicy,
        now_ms: i64,
        error: &str,
    ) -> Result<CircuitChange, StoreError> {
        let word = match signal {
            Signal::Up => "up",
            Signal::Down => "down",
            Signal::Unknown => return Ok(CircuitChange::Unchanged),
        };
        let r: Result<String, _> = RECORD_SCRIPT
            .key(self.redis.keys.tool_health(tool))
            .key(self.redis.keys.tool_probe(tool))
            .key(self.redis.keys.tool_circuit_history(tool))
            .arg(word)
            .arg(now_ms)
            .arg(policy.failure_threshold)
            .arg(policy.probe_interval.as_millis().max(1) as u64)
            .arg(HEALTH_TTL_SECS)
            .arg(error)
            .arg(CIRCUIT_HISTORY_MAX)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        let transition = match self.redis.count(r)?.as_str() {
            "opened" => CircuitChange::Opened,
            "closed" => CircuitChange::Closed,
            "open" => CircuitChange::StillOpen,
            _ => CircuitChange::Unchanged,
        };
        match transition {
            CircuitChange::Opened | CircuitChange::StillOpen => self.index_open(tool, true, now_ms).await,
            CircuitChange::Closed => self.index_open(tool, false, now_ms).await,
            CircuitChange::Unchanged => {}
        }
        Ok(transition)
    }

    /// Closes the circuit of `tool` by hand (its consecutive failures reset); answers whether it
    /// was open. `by` (the operator's actor) goes into the circuit's history.
    pub async fn close_circuit(&self, tool: &str, now_ms: i64, by: &str) -> Result<bool, StoreError> {
        let r: Result<String, _> = CLOSE_SCRIPT
            .key(self.redis.keys.tool_health(tool))
            .key(self.redis.keys.tool_probe(tool))
            .key(self.redis.keys.tool_circuit_history(tool))
            .arg(now_ms)
            .arg(HEALTH_TTL_SECS)
            .arg(by)
            .arg(CIRCUIT_HISTORY_MAX)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        let was_open = self.redis.count(r)? == "open";
        self.index_open(tool, false, now_ms).await;
        Ok(was_open)
    }

    /// The health of `tool` (all empty for a tool never called).
    pub async fn tool_health(&self, tool: &str) -> Result<ToolHealth, StoreError> {
        let r: Result<std::collections::HashMap<String, String>, _> = redis::cmd("HGETALL")
            .arg(self.redis.keys.tool_health(tool))
            .query_async(&mut self.redis.conn().await?)
            .await;
        let hash = self.redis.count(r)?;
        let number = |name: &str| hash.get(name).and_then(|v| v.parse::<i64>().ok());
        Ok(ToolHealth {
            open: hash.get("state").is_some_and(|s| s == "open"),
            consecutive_failures: number("consecutive_failures").unwrap_or(0).max(0) as u64,
            last_success_ms: number("last_success_ms"),
            last_failure_ms: number("last_failure_ms"),
            opened_at_ms: number("opened_at_ms"),
        })
    }

    /// The latest `limit` changes of the circuit of `tool`, newest first (an entry that does not
    /// decode is left out).
    pub async fn circuit_history(&self, tool: &str, limit: usize) -> Result<Vec<CircuitEvent>, StoreError> {
        let r: Result<Vec<String>, _> = redis::cmd("LRANGE")
            .arg(self.redis.keys.tool_circuit_history(tool))
            .arg(0)
            .arg(limit.saturating_sub(1))
            .query_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)?.iter().filter_map(|e| serde_json::from_str(e).ok()).collect())
    }

    /// Tools the open-circuit index names (each to be checked against its health: the index is
    /// written after the hash and may lag it).
    pub async fn open_circuits(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        let r: Result<Vec<String>, _> = redis::cmd("ZRANGE")
            .arg(self.redis.keys.open_circuits())
            .arg(0)
            .arg(limit.saturating_sub(1))
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r)
    }

    /// Drops `tool` from the open-circuit index (its reader found it closed).
    pub async fn forget_open_circuit(&self, tool: &str) -> Result<(), StoreError> {
        let r: Result<i64, _> = redis::cmd("ZREM")
            .arg(self.redis.keys.open_circuits())
            .arg(tool)
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r).map(|_| ())
    }

    /// Best effort: the hash is the truth; a missed write here is repaired by the next failure
    /// while open (re-added) or by the reader (removed).
    async fn index_open(&self, tool: &str, open: bool, now_ms: i64) {
        let Ok(mut conn) = self.redis.conn().await else { return };
        let key = self.redis.keys.open_circuits();
        let r: Result<i64, _> = if open {
            redis::cmd("ZADD").arg(&key).arg("NX").arg(now_ms).arg(tool).query_async(&mut conn).await
        } else {
            redis::cmd("ZREM").arg(&key).arg(tool).query_async(&mut conn).await
        };
        if let Err(e) = r {
            self.redis.metrics.redis_errors.inc();
            tracing::debug!(error = %e, tool, "open-circuit index not updated");
        }
    }
}

/// When the probe slot frees, from its `PTTL`: -1 (a key without expiry) is unknown; -2 (gone)
/// and 0 (under a millisecond left) mean now. Calls deferred until the slot frees arrive just as
/// it expires, so "now" is common: read as unknown, it deferred them a whole default interval.
fn probe_free_in(pttl_ms: i64) -> Option<Duration> {
    match pttl_ms {
        -1 => None,
        ms => Some(Duration::from_millis(ms.max(0) as u64)),
    }
}

#[cfg(test)]
mod probe_tests {
    use super::*;

    #[test]
    fn a_probe_slot_expiring_or_gone_frees_now_and_only_no_expiry_is_unknown() {
        assert_eq!(probe_free_in(1_500), Some(Duration::from_millis(1_500)));
        assert_eq!(probe_free_in(0), Some(Duration::ZERO));
        assert_eq!(probe_free_in(-2), Some(Duration::ZERO));
        assert_eq!(probe_free_in(-1), None);
    }
}
