//! A tool's limits in a tool call's pipeline: before its attempt, a call takes one of its tool's
//! fleet-wide concurrency slots (`max_concurrency`) and its rate limiter's go-ahead (`rate_limit`).
//! Over either, the call is deferred in the broker: its claim is given back and it is parked
//! (no worker slot held, no attempt spent, nothing recorded). The concurrency slot is held only
//! while the attempt runs, renewed with the claim, and given back however the attempt ends; a
//! worker that dies leaves a lease that runs out.

use std::future::Future;
use std::time::Duration;

use fleet_platform::store::{ClaimAfter, Fence, Pace, Semaphore, SlotGrant, StoreError, Transition};
use fleet_protocol::envelope::{Envelope, Job};
use fleet_protocol::limits::RateLimit;
use fleet_protocol::retry::EARLY_RETURN_TOLERANCE;

use crate::context::Cx;
use crate::outcome::{HeldClaim, Outcome};

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
pub(crate) struct ToolAdmission {
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

/// Whether the job's tool has limits (read from the policies cache): its claim then only holds the
/// record until they let it through.
pub(crate) async fn applies(cx: &Cx<'_>, envelope: &Envelope) -> bool {
    match &envelope.job {
        Job::ToolCall(call) => match cx.policies_of(&call.tool_name).await {
            Ok(policies) => !policies.limits.is_none(),
            // Unknown: the claim only holds, and the check below decides.
            Err(_) => true,
        },
        Job::Webhook(_) | Job::Turn(_) => false,
    }
}

/// Lets the claimed call through its tool's limits, or defers it: `Err` is how the job ends (the
/// claim given back, the job parked for as long as the limit says).
pub(crate) async fn admit(cx: &Cx<'_>, envelope: &Envelope, held: HeldClaim) -> Result<ToolAdmission, Outcome> {
    let tool = match &envelope.job {
        Job::ToolCall(call) => call.tool_name.as_str(),
        Job::Webhook(_) | Job::Turn(_) => return Ok(ToolAdmission { slot: None }),
    };
    match check(cx, tool, &envelope.execution_id, held.token).await {
        Ok(admission) => Ok(admission),
        Err((reason, wait)) => {
            cx.metrics.tool_deferred.with_label_values(&[tool, reason.label()]).inc();
            tracing::debug!(
                reason = reason.label(),
                wait_ms = wait.as_millis() as u64,
                "deferred by the tool's limits"
            );
            let released = Transition::new(ClaimAfter::Release("released"));
            let lease = cx.config.claim_lease;
            match cx
                .store
                .executions()
                .transition(&envelope.execution_id, Fence::Token(held.token), lease, &released)
                .await
            {
                Ok(false) => Err(Outcome::Fenced),
                // Given back: the park is this claim's, and marks the record once it is published.
                Ok(true) => Err(Outcome::ParkedStep(wait, held.token)),
                Err(_) => Err(Outcome::Parked(wait)),
            }
        }
    }
}

/// The slot first, then the rate: a slot given back costs nothing, while the rate limiter's go-ahead
/// is spent once given, so it is asked only by a call that may run at once.
async fn check(cx: &Cx<'_>, tool: &str, execution_id: &str, token: u64) -> Result<ToolAdmission, (Deferral, Duration)> {
    let fail_closed = cx.soon();
    let unavailable = |e: StoreError| {
        tracing::warn!(error = %e, "cannot check the tool's limits (Redis unavailable); deferred");
        (Deferral::Unavailable, fail_closed)
    };
    let limits = cx.policies_of(tool).await.map_err(unavailable)?.limits;
    let mut admission = ToolAdmission { slot: None };
    if let Some(limit) = limits.max_concurrency {
        let holder = holder(execution_id, token);
        match cx
            .store
            .limits()
            .acquire_slot(Semaphore::Tool(tool), &holder, limit, cx.config.claim_lease)
            .await
            .map_err(unavailable)?
        {
            SlotGrant::Acquired => admission.slot = Some(HeldSlot { tool: tool.to_string(), holder }),
            SlotGrant::Full { .. } => return Err((Deferral::Concurrency, CONCURRENCY_RECHECK)),
        }
    }
    if let Some(limit) = &limits.rate_limit {
        let paced = cx.store.limits().pace_tool(tool, execution_id, limit, early_allowance(limit)).await;
        let deferral = match paced {
            Ok(Pace::Now) => return Ok(admission),
            Ok(Pace::Wait(wait)) => (Deferral::RateLimit, wait),
            Err(e) => unavailable(e),
        };
        release(cx, admission).await;
        return Err(deferral);
    }
    Ok(admission)
}

/// Runs `work` (the attempt) while renewing the call's concurrency slot every third of the lease,
/// as the claim is renewed around it.
pub(crate) async fn holding<T>(cx: &Cx<'_>, admission: &ToolAdmission, work: impl Future<Output = T>) -> T {
    let Some(slot) = &admission.slot else { return work.await };
    holding_slot(cx, Semaphore::Tool(&slot.tool), &slot.holder, work).await
}

/// Runs `work` while renewing `holder`'s slot of `semaphore` (a tool's, a tenant's turns') every
/// third of the lease, as the claim is renewed around it. A slot that ran out is only logged: the
/// claim, not the slot, decides whether the work may go on.
pub(crate) async fn holding_slot<T>(
    cx: &Cx<'_>,
    semaphore: Semaphore<'_>,
    holder: &str,
    work: impl Future<Output = T>,
) -> T {
    let (store, lease) = (cx.store, cx.config.claim_lease);
    let renew = move || async move {
        if let Ok(false) = store.limits().renew_slot(semaphore, holder, lease).await {
            tracing::warn!(?semaphore, "a concurrency slot ran out while its work ran");
        }
        true
    };
    super::claim::while_renewing(lease, work, renew).await.expect("a slot's renewal never stops the work")
}

/// Gives the slot back. A Redis error leaves it to its lease, which runs out by itself.
pub(crate) async fn release(cx: &Cx<'_>, admission: ToolAdmission) {
    if let Some(slot) = admission.slot {
        give_back(cx, Semaphore::Tool(&slot.tool), &slot.holder).await;
    }
}

/// Gives `holder`'s slot of `semaphore` back; a Redis error leaves it to its lease.
pub(crate) async fn give_back(cx: &Cx<'_>, semaphore: Semaphore<'_>, holder: &str) {
    if let Err(e) = cx.store.limits().release_slot(semaphore, holder).await {
        tracing::warn!(error = %e, ?semaphore, "cannot give the concurrency slot back; its lease runs out");
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
}
