//! The claim before any side effect: what a delivery is (the record's step, a copy, owed work, a
//! finished or cancelled execution, a step another worker runs), decided by one script, and the
//! lease renewed while the step's work runs.

use std::future::Future;
use std::time::Duration;

use serde_json::Value;

use fleet_platform::now_ms;
use fleet_platform::store::{ClaimAfter, Delivery, DeliveryClaim, Fence, NewExecution, Transition};
use fleet_protocol::envelope::{Envelope, Job};
use fleet_protocol::life::{Claimed, Owed};
use fleet_protocol::turn::TurnState;

use crate::context::Cx;
use crate::outcome::{Finished, HeldClaim, Outcome};

pub(crate) use fleet_platform::store::AdmitMode as Mode;

/// A delivery that may go on.
#[derive(Debug)]
pub(crate) enum Claim {
    /// The record's step, claimed; `cancel_requested` says a client asked to cancel (a turn), and
    /// `turn` is a turn's state, read with the claim.
    Step { held: HeldClaim, cancel_requested: bool, turn: Option<Box<TurnState>> },
    /// An earlier step while the record owes something: the delivery carries it out.
    Owed { owed: Owed, result: Option<Value> },
    /// The execution was cancelled before this step ran.
    Cancelled,
}

/// Claims the delivery's step. `Err` is how the delivery ends instead: a copy (counted), done
/// already, or busy elsewhere or Redis unavailable (parked, no attempt spent).
pub(crate) async fn admit(cx: &Cx<'_>, envelope: &Envelope, mode: Mode) -> Result<Claim, Outcome> {
    let id = &envelope.execution_id;
    let kind = envelope.kind().as_str();
    for _ in 0..2 {
        let with_turn = matches!(envelope.job, Job::Turn(_));
        let delivery = Delivery { step: envelope.step(), park: envelope.park, with_turn };
        let claimed =
            cx.store.executions().admit_delivery(id, &cx.config.worker_id, cx.config.claim_lease, delivery, mode).await;
        let DeliveryClaim { claimed, cancel_requested, turn } = match claimed {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot claim (Redis unavailable); parked");
                return Err(Outcome::Parked(cx.soon()));
            }
        };
        match claimed {
            Claimed::Held { token } => {
                return Ok(Claim::Step { held: HeldClaim { token }, cancel_requested, turn: turn.map(Box::new) })
            }
            Claimed::Owed { owed, result } => return Ok(Claim::Owed { owed, result }),
            Claimed::Cancelled => return Ok(Claim::Cancelled),
            Claimed::Copy => {
                tracing::info!(
                    "a copy of an earlier step, of a parked step, or of an execution that ended; only acked"
                );
                cx.metrics.duplicate_deliveries.with_label_values(&[kind]).inc();
                return Err(Outcome::Copy);
            }
            Claimed::Done { .. } => {
                tracing::info!("already succeeded; not run again");
                cx.metrics.idempotency_hits.with_label_values(&[kind]).inc();
                cx.metrics.duplicate_deliveries.with_label_values(&[kind]).inc();
                return Err(Outcome::Done(Finished::Duplicate));
            }
            Claimed::Busy { remaining_ms } => {
                tracing::info!(remaining_ms, "this step runs under another claim; parked until its lease ends");
                return Err(Outcome::Parked(Duration::from_millis(remaining_ms)));
            }
            Claimed::Missing => {
                if let Err(e) = restore_record(cx, envelope).await {
                    tracing::warn!(error = %e, "cannot restore the execution's record; parked");
                    return Err(Outcome::Parked(cx.soon()));
                }
            }
        }
    }
    Err(Outcome::Parked(cx.soon()))
}

/// A job whose record is not beside its claim: one written before records moved there is moved;
/// one that is gone altogether (past its retention) starts over, queued.
async fn restore_record(cx: &Cx<'_>, envelope: &Envelope) -> Result<(), fleet_platform::store::StoreError> {
    let id = &envelope.execution_id;
    if cx.store.executions().migrate_legacy(id).await? {
        return Ok(());
    }
    tracing::warn!("the job's execution record is gone; it starts a new one");
    let (tool_name, room_id, assistant_id) = match &envelope.job {
        Job::ToolCall(call) => (Some(call.tool_name.as_str()), call.room_id.as_deref(), call.assistant_id.as_deref()),
        Job::Turn(step) => (None, Some(step.session_id.as_str()), None),
        Job::Webhook(_) => (None, None, None),
    };
    let new = NewExecution {
        execution_id: id,
        kind: envelope.kind(),
        tool_name,
        room_id,
        assistant_id,
        tenant: None,
        now_ms: now_ms(),
        run_at_ms: None,
    };
    cx.store.executions().create_execution(&new, None).await.map(|_| ())
}

/// Runs `work` while renewing the claim every third of the lease. `None`: a newer claim took the
/// job meanwhile and `stop_when_lost` dropped the work.
pub(crate) async fn renewing<T>(
    cx: &Cx<'_>,
    execution_id: &str,
    held: HeldClaim,
    stop_when_lost: bool,
    work: impl Future<Output = T>,
) -> Option<T> {
    let (store, lease) = (cx.store, cx.config.claim_lease);
    let renew = move || async move {
        let kept = !matches!(store.executions().renew(execution_id, held.token, lease).await, Ok(false));
        if !kept {
            tracing::warn!("lease lost to another worker during the step");
        }
        kept || !stop_when_lost
    };
    while_renewing(lease, work, renew).await
}

/// Runs `work` while `renew` runs every third of `lease` (the claim's, a tool slot's). `None`:
/// `renew` answered that the work must stop.
pub(crate) async fn while_renewing<T, F: Future<Output = bool>>(
    lease: std::time::Duration,
    work: impl Future<Output = T>,
    mut renew: impl FnMut() -> F,
) -> Option<T> {
    tokio::pin!(work);
    // The first tick is a third of the lease away. An interval's immediate first tick is not
    // immediate: the timer wheel rounds it up to its next millisecond, and the work would wait for it.
    let period = lease / 3;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            done = &mut work => return Some(done),
            _ = tick.tick() => {
                if !renew().await {
                    return None;
                }
            }
        }
    }
}

/// Gives a callback job's claim back and parks it for `wait`: something it needs failed, or
/// waits, before any side effect (the claim's holder no longer matters: a newer one is fine).
pub(super) async fn release_and_park(cx: &Cx<'_>, envelope: &Envelope, held: HeldClaim, wait: Duration) -> Outcome {
    let released = Transition::new(ClaimAfter::Release("released"));
    let lease = cx.config.claim_lease;
    let _ = cx.store.executions().transition(&envelope.execution_id, Fence::Token(held.token), lease, &released).await;
    Outcome::Parked(wait)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::FutureExt;

    use super::while_renewing;

    /// The work starts on the first poll: a renewal timer's first tick, rounded up to the timer
    /// wheel's next millisecond, once held every callback and model call back by up to 1 ms.
    #[tokio::test]
    async fn the_work_starts_at_once_not_at_the_timers_first_tick() {
        let renewals = std::cell::Cell::new(0);
        let first_poll = while_renewing(Duration::from_secs(60), async { 7 }, || {
            renewals.set(renewals.get() + 1);
            async { true }
        })
        .now_or_never();
        assert_eq!(first_poll, Some(Some(7)), "the work ran on the first poll");
        assert_eq!(renewals.get(), 0, "nothing is renewed before a third of the lease");
    }

    /// A renewal comes a third of the lease after the work started, and every third after; one
    /// that answers `false` stops the work.
    #[tokio::test(start_paused = true)]
    async fn renewals_come_every_third_of_the_lease_and_can_stop_the_work() {
        let started = tokio::time::Instant::now();
        let at = std::sync::Mutex::new(vec![]);
        let out = while_renewing(Duration::from_secs(3), std::future::pending::<()>(), || {
            let mut at = at.lock().unwrap();
            at.push(started.elapsed());
            let go_on = at.len() < 3;
            async move { go_on }
        })
        .await;
        assert_eq!(out, None, "the third renewal stopped the work");
        let secs: Vec<u64> = at.lock().unwrap().iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 3]);
    }
}
