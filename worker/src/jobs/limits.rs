//! A tool's limits in a tool call's pipeline: before its attempt, a call takes one of its tool's
//! fleet-wide concurrency slots (`max_concurrency`) and its rate limiter's go-ahead (`rate_limit`).
//! Over either, the call is deferred in the broker: its claim is given back and it is parked
//! (no worker slot held, no attempt spent, nothing recorded). The concurrency slot is held only
//! while the attempt runs, renewed with the claim, and given back however the attempt ends; a
//! worker that dies leaves a lease that runs out.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fleet_platform::store::{Pace, SlotGrant, StoreError};
use fleet_protocol::circuit::CircuitBreaker;
use fleet_protocol::envelope::{Envelope, Job};
use fleet_protocol::limits::{RateLimit, ToolLimits};
use fleet_protocol::retry::EARLY_RETURN_TOLERANCE;

use crate::process::Processor;
use crate::settle::{Held, Outcome};

/// How soon a call over the concurrency limit asks again. When a slot frees cannot be known (a
/// lease is renewed while its POST runs), so it asks again soon: the park rounds this up to the
/// broker's shortest delay queue.
pub(crate) const CONCURRENCY_RECHECK: Duration = Duration::from_millis(250);

/// Why a call was deferred: the `reason` of `fleet_tool_deferred_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deferral {
    Concurrency,
    RateLimit,
    /// Redis could not answer: fail closed, as the claim does.
    Unavailable,
}

impl Deferral {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Deferral::Concurrency => "concurrency",
            Deferral::RateLimit => "rate_limit",
            Deferral::Unavailable => "unavailable",
        }
    }
}

/// The concurrency slot a call holds for one attempt, if its tool has a limit.
pub(crate) struct Admission {
    slot: Option<HeldSlot>,
}

struct HeldSlot {
    tool: String,
    holder: String,
}

/// The semaphore's holder name for one claim: the token keeps a fenced-off copy's release from
/// freeing the slot of the claim that replaced it.
pub(crate) fn holder(execution_id: &str, token: u64) -> String {
    format!("{execution_id}:{token}")
}

/// How early a reserved call may run: the broker's early-return tolerance, but at most half an
/// interval, so a fast limit is not bunched up by it.
pub(crate) fn early_allowance(limit: &RateLimit) -> Duration {
    EARLY_RETURN_TOLERANCE.min(Duration::from_secs_f64(limit.interval_ms() / 2000.0))
}

/// What a tool call's pipeline needs of its tool's registry entry before the attempt: its limits
/// and its circuit breaker.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ToolPolicies {
    pub(crate) limits: ToolLimits,
    pub(crate) circuit: Option<CircuitBreaker>,
}

/// A tool's policies, cached like the registry targets (a change reaches every worker within the
/// cache's ttl).
pub(crate) struct LimitsCache {
    ttl: Duration,
    entries: Mutex<HashMap<String, (Instant, ToolPolicies)>>,
}

impl LimitsCache {
    pub(crate) fn new(ttl: Duration) -> Self {
        LimitsCache { ttl, entries: Mutex::new(HashMap::new()) }
    }

    fn get(&self, tool: &str) -> Option<ToolPolicies> {
        let entries = self.entries.lock().unwrap();
        entries.get(tool).filter(|(at, _)| at.elapsed() < self.ttl).map(|(_, l)| l.clone())
    }

    fn put(&self, tool: &str, limits: ToolPolicies) {
        let mut entries = self.entries.lock().unwrap();
        if entries.len() > 10_000 {
            entries.retain(|_, (at, _)| at.elapsed() < self.ttl);
        }
        entries.insert(tool.to_string(), (Instant::now(), limits));
    }
}

pub(crate) async fn policies_of(p: &Processor, tool: &str) -> Result<ToolPolicies, StoreError> {
    if let Some(policies) = p.limits.get(tool) {
        return Ok(policies);
    }
    // A tool no longer registered has no policies; its attempt fails on its own.
    let policies = p
        .store
        .get_tool(tool)
        .await?
        .map(|t| ToolPolicies { limits: t.limits, circuit: t.circuit_breaker })
        .unwrap_or_default();
    p.limits.put(tool, policies.clone());
    Ok(policies)
}

async fn limits_of(p: &Processor, tool: &str) -> Result<ToolLimits, StoreError> {
    policies_of(p, tool).await.map(|policies| policies.limits)
}

/// Lets the claimed call through its tool's limits, or defers it: `Err` is how the job ends (the
/// claim given back, the job parked for as long as the limit says).
pub(crate) async fn admit(p: &Processor, envelope: &Envelope, held: &Held) -> Result<Admission, Outcome> {
    let Job::ToolCall(call) = &envelope.job else { return Ok(Admission { slot: None }) };
    let tool = call.tool_name.as_str();
    match check(p, tool, &envelope.execution_id, held.token).await {
        Ok(admission) => Ok(admission),
        Err((reason, wait)) => {
            p.metrics.tool_deferred.with_label_values(&[tool, reason.label()]).inc();
            tracing::debug!(
                reason = reason.label(),
                wait_ms = wait.as_millis() as u64,
                "deferred by the tool's limits"
            );
            if !p.release(held, "released").await {
                return Err(Outcome::Fenced);
            }
            Err(Outcome::Parked(wait))
        }
    }
}

/// The slot first, then the rate: a slot given back costs nothing, while the rate limiter's go-ahead
/// is spent once given, so it is asked only by a call that may run at once.
async fn check(p: &Processor, tool: &str, execution_id: &str, token: u64) -> Result<Admission, (Deferral, Duration)> {
    let fail_closed = p.config.common.retry.delays()[0];
    let unavailable = |e: StoreError| {
        tracing::warn!(error = %e, "cannot check the tool's limits (Redis unavailable); deferred");
        (Deferral::Unavailable, fail_closed)
    };
    let limits = limits_of(p, tool).await.map_err(unavailable)?;
    let mut admission = Admission { slot: None };
    if let Some(limit) = limits.max_concurrency {
        let holder = holder(execution_id, token);
        match p.store.acquire_tool_slot(tool, &holder, limit, p.config.claim_lease).await.map_err(unavailable)? {
            SlotGrant::Acquired => admission.slot = Some(HeldSlot { tool: tool.to_string(), holder }),
            SlotGrant::Full { .. } => return Err((Deferral::Concurrency, CONCURRENCY_RECHECK)),
        }
    }
    if let Some(limit) = &limits.rate_limit {
        let paced = p.store.pace_tool(tool, execution_id, limit, early_allowance(limit)).await;
        let deferral = match paced {
            Ok(Pace::Now) => return Ok(admission),
            Ok(Pace::Wait(wait)) => (Deferral::RateLimit, wait),
            Err(e) => unavailable(e),
        };
        release(p, admission).await;
        return Err(deferral);
    }
    Ok(admission)
}

/// Runs `work` (the attempt) while renewing the call's concurrency slot every third of the lease,
/// as the claim is renewed around it.
pub(crate) async fn holding<T>(p: &Processor, admission: &Admission, work: impl Future<Output = T>) -> T {
    let Some(slot) = &admission.slot else { return work.await };
    let lease = p.config.claim_lease;
    tokio::pin!(work);
    let mut renew = tokio::time::interval(lease / 3);
    renew.tick().await;
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = renew.tick() => {
                if let Ok(false) = Box::pin(p.store.renew_tool_slot(&slot.tool, &slot.holder, lease)).await {
                    tracing::warn!(tool = %slot.tool, "the tool's concurrency slot ran out during the attempt");
                }
            }
        }
    }
}

/// Gives the slot back. A Redis error leaves it to its lease, which runs out by itself.
pub(crate) async fn release(p: &Processor, admission: Admission) {
    if let Some(slot) = admission.slot {
        if let Err(e) = p.store.release_tool_slot(&slot.tool, &slot.holder).await {
            tracing::warn!(error = %e, tool = %slot.tool, "cannot give the concurrency slot back; its lease runs out");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deferral_reasons_are_the_metrics_labels() {
        let labels: Vec<_> =
            [Deferral::Concurrency, Deferral::RateLimit, Deferral::Unavailable].iter().map(|d| d.label()).collect();
        assert_eq!(labels, ["concurrency", "rate_limit", "unavailable"]);
    }

    #[test]
    fn each_claim_holds_its_own_slot() {
        assert_eq!(holder("exec_1", 3), "exec_1:3");
        assert_ne!(holder("exec_1", 3), holder("exec_1", 4));
    }

    #[test]
    fn a_reserved_call_may_run_a_little_early_but_never_half_an_interval() {
        let slow = RateLimit { per_second: 5.0, burst: 1 };
        assert_eq!(early_allowance(&slow), EARLY_RETURN_TOLERANCE);
        let fast = RateLimit { per_second: 100.0, burst: 1 };
        assert_eq!(early_allowance(&fast), Duration::from_millis(5));
    }

    #[test]
    fn cached_limits_expire() {
        let cache = LimitsCache::new(Duration::from_millis(30));
        let limits = ToolPolicies {
            limits: ToolLimits { max_concurrency: Some(2), rate_limit: None },
            circuit: Some(CircuitBreaker { failure_threshold: Some(3), probe_interval_seconds: None }),
        };
        cache.put("t", limits.clone());
        assert_eq!(cache.get("t"), Some(limits));
        assert_eq!(cache.get("u"), None);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(cache.get("t"), None);
    }
}
