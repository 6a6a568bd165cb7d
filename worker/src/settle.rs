//! How a job's delivery ends: every job kind returns an `Outcome`, and `settle` carries it out
//! before the delivery is acked. A transition is written first (the record's next step and what
//! it owes: the next delivery's publish, or the dead letter), then what it owes is done, then
//! retired: a worker that dies in between leaves the owed work to the next copy of the job. A
//! publish the broker refuses is tried again while the delivery is held, so a job keeps its
//! schedule however long the broker refuses (never re-run at once, never dead-lettered for it).

use std::time::Duration;

use futures::future::BoxFuture;
use lapin::types::{AMQPValue, LongString, ShortString};
use lapin::BasicProperties;

use fleet_platform::dead_letters;
use fleet_platform::now_ms;
use fleet_platform::store::{ClaimAfter, Fence, Transition};
use fleet_protocol::dead_letters::{DeadLetterReason, DeadLetterRecord, RECORD_MESSAGE_TYPE};
use fleet_protocol::envelope::{Envelope, PollState, Verdict, CONTENT_TYPE};
use fleet_protocol::execution::{AttemptOutcome, ExecutionStatus};
use fleet_protocol::life::Owed;
use fleet_protocol::retry::RetryDecision;

use crate::context::Cx;
use crate::outcome::{DeadLetter, Failure, HeldClaim, Outcome, Settle};
use crate::publish::{park, park_step, publish_holding, publish_next, retire, retrying_redis, trace_headers};

/// Carries `outcome` out. Its future is boxed here, once per delivery: `settle` calls itself (what
/// a copy carried out is settled in turn), and a future that contains itself must be boxed. Boxed
/// at its start, it also lives only after the job, and does not size every job's task.
pub(crate) fn settle<'a>(cx: &'a Cx<'_>, envelope: &'a Envelope, outcome: Outcome) -> BoxFuture<'a, Settle> {
    Box::pin(carry_out(cx, envelope, outcome))
}

async fn carry_out(cx: &Cx<'_>, envelope: &Envelope, outcome: Outcome) -> Settle {
    let kind = envelope.kind().as_str();
    match outcome {
        Outcome::Done(finished) => {
            cx.finished(kind, finished.label());
            if finished == crate::outcome::Finished::Success {
                observe_latency(cx, envelope, "success");
            }
            Settle::Ack
        }
        Outcome::Copy => {
            cx.finished(kind, "copy");
            Settle::Ack
        }
        Outcome::Failed(failure) => after_failure(cx, envelope, failure).await,
        Outcome::DeadLetter(dead) => dead_letter(cx, envelope, dead).await,
        Outcome::Fenced => {
            tracing::warn!("a newer claim fenced this worker off; its writes are dropped");
            cx.finished(kind, "fenced");
            Settle::Ack
        }
        Outcome::Parked(remaining) => {
            cx.finished(kind, "deferred");
            park(cx, envelope, remaining).await
        }
        Outcome::ParkedStep(remaining, token) => {
            cx.finished(kind, "deferred");
            park_step(cx, envelope, remaining, token).await
        }
        Outcome::Poll(poll, held) => poll_later(cx, envelope, &poll, held).await,
        Outcome::Requeue => Settle::Requeue,
        Outcome::Abandon => Settle::Abandon,
        // Resolved by `jobs::run`; a stage that returns it directly settles what the copy carried.
        Outcome::Owed(owed, result) => settle(cx, envelope, crate::jobs::carry(cx, envelope, owed, result).await).await,
    }
}

async fn after_failure(cx: &Cx<'_>, envelope: &Envelope, mut failure: Failure) -> Settle {
    let decision = if failure.permanent {
        RetryDecision::Exhausted
    } else {
        // The tool's or webhook's own schedule, else the fleet's default.
        crate::retry_policy::decision(cx, envelope, failure.retry_after).await
    };
    match decision {
        RetryDecision::Retry { next_attempt, wait, step } => {
            retry_later(cx, envelope, failure, next_attempt, wait, step).await
        }
        RetryDecision::Exhausted => {
            let (reason, outcome) = if failure.permanent {
                (DeadLetterReason::Permanent, AttemptOutcome::Permanent)
            } else {
                (DeadLetterReason::Exhausted, AttemptOutcome::Exhausted)
            };
            failure.record.outcome = outcome;
            let dead = DeadLetter {
                reason,
                error: failure.error,
                record: Some(failure.record),
                held: Some(failure.held),
                code: None,
            };
            dead_letter(cx, envelope, dead).await
        }
    }
}

/// Attempt n+1, held by the broker: recorded as owed with the attempt and the claim given back in
/// one write, then published to its delay queue, then retired; the delivery is acked after.
async fn retry_later(
    cx: &Cx<'_>,
    envelope: &Envelope,
    mut failure: Failure,
    next_attempt: u32,
    wait: Duration,
    step: usize,
) -> Settle {
    crate::jobs::before_retry(cx, envelope, &failure.error).await;
    failure.record.outcome = AttemptOutcome::Retry;
    let next = Envelope {
        attempt: next_attempt,
        first_attempt_at_ms: Some(envelope.first_attempt_at_ms.unwrap_or(failure.started_ms)),
        not_before_ms: Some(now_ms() + wait.as_millis() as i64),
        poll: None,
        ..envelope.clone()
    };
    let owed = Owed::Next { envelope: Box::new(next.clone()) };
    let transition = Transition::new(ClaimAfter::Release("released"))
        .status(ExecutionStatus::Retrying)
        .step(next.step())
        .owe(&owed)
        .attempt(&failure.record);
    if let Err(settle) = write(cx, envelope, failure.held, &transition).await {
        return settle;
    }
    let queue = cx.config.common.topology.delay_queue(envelope.kind(), step);
    if let Err(settle) =
        publish_holding(cx, envelope, || cx.publisher.publish_delayed(&queue, &next, trace_headers())).await
    {
        return settle;
    }
    retire(cx, envelope, &owed).await;
    let attempt = next_attempt.to_string();
    cx.metrics.retries_scheduled.with_label_values(&[envelope.kind().as_str(), &attempt]).inc();
    cx.finished(envelope.kind().as_str(), "retry");
    Settle::Ack
}

/// A 202 (or a poll still pending): the attempt goes on in the broker, not in a sleeping task. Its
/// next poll is owed, the claim given back as `polling`; no attempt is spent.
async fn poll_later(cx: &Cx<'_>, envelope: &Envelope, poll: &PollState, held: HeldClaim) -> Settle {
    let interval = cx.config.async_poll_interval;
    let seq = envelope.step().poll + 1;
    let next = Envelope {
        first_attempt_at_ms: Some(envelope.first_attempt_at_ms.unwrap_or(poll.started_at_ms)),
        not_before_ms: Some(now_ms() + interval.as_millis() as i64),
        poll: Some(PollState { seq, ..poll.clone() }),
        ..envelope.clone()
    };
    let owed = Owed::Next { envelope: Box::new(next.clone()) };
    let transition = Transition::new(ClaimAfter::Release("polling")).step(next.step()).owe(&owed);
    if let Err(settle) = write(cx, envelope, held, &transition).await {
        return settle;
    }
    if let Err(settle) = publish_next(cx, &next).await {
        return settle;
    }
    retire(cx, envelope, &owed).await;
    cx.finished(envelope.kind().as_str(), "polling");
    Settle::Ack
}

/// The one way a job becomes a dead letter: decided (its last attempt recorded and the dead letter
/// owed, in one write), its aftermath (failure events, the parent turn told, a turn's session
/// freed), the dead letter made durable, then its status. Cut short anywhere, the job is parked
/// and its next delivery, a copy of an earlier step now, carries the owed dead letter out.
async fn dead_letter(cx: &Cx<'_>, envelope: &Envelope, dead: DeadLetter) -> Settle {
    let id = &envelope.execution_id;
    let verdict = Verdict { reason: dead.reason, error: dead.error.clone() };
    let owed = Owed::Settle { verdict };
    if let Some(held) = dead.held {
        let mut decided = Transition::new(ClaimAfter::Keep).step(envelope.step().next_attempt()).owe(&owed);
        if let Some(record) = &dead.record {
            decided = decided.attempt(record);
        }
        if let Err(settle) = write(cx, envelope, held, &decided).await {
            return settle;
        }
    }
    let history = match cx.store.executions().get_execution(id).await {
        Ok(Some(view)) => view.attempts,
        _ => dead.record.into_iter().collect(),
    };
    let record = DeadLetterRecord::for_job(envelope, dead.reason, &dead.error, history, now_ms());
    if let Err(e) = crate::jobs::aftermath(cx, envelope, &record, dead.code).await {
        tracing::warn!(error = %e, "the dead letter's aftermath failed; it is carried out again later");
        return park(cx, envelope, cx.soon()).await;
    }
    match publish_dead_letter(cx, id, &record, envelope.kind().as_str()).await {
        Settle::Ack => {}
        Settle::Requeue | Settle::Abandon => return park(cx, envelope, cx.soon()).await,
    }
    let ended =
        Transition::new(ClaimAfter::Release("dead_lettered")).status(ExecutionStatus::DeadLettered).owe_nothing();
    if let Err(e) = cx.store.executions().transition(id, Fence::Owed(&owed), cx.config.claim_lease, &ended).await {
        tracing::warn!(error = %e, "dead letter stored; its status is written by the next copy");
        return park(cx, envelope, cx.soon()).await;
    }
    cx.finished(envelope.kind().as_str(), dead_letter_label(dead.reason));
    observe_latency(cx, envelope, "dead_letter");
    Settle::Ack
}

/// Writes `transition` under `held`, trying again while Redis is unavailable (a failover takes
/// seconds) for up to a third of the lease, which was renewed at most a third ago: giving up
/// sooner would requeue a job whose attempt ran, and run it again. `Err` is how the delivery ends.
async fn write(cx: &Cx<'_>, envelope: &Envelope, held: HeldClaim, transition: &Transition<'_>) -> Result<(), Settle> {
    let id = &envelope.execution_id;
    let lease = cx.config.claim_lease;
    let written =
        retrying_redis(lease / 3, || cx.store.executions().transition(id, Fence::Token(held.token), lease, transition))
            .await;
    match written {
        Ok(true) => Ok(()),
        Ok(false) => {
            tracing::warn!("a newer claim fenced this worker off; its writes are dropped");
            cx.finished(envelope.kind().as_str(), "fenced");
            Err(Settle::Ack)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot record how the step ended; requeued");
            Err(Settle::Requeue)
        }
    }
}

/// Makes the dead letter durable; only then may the job be acked. Redis is its store of record;
/// the dead-letter queue gets a copy too, marked as stored (operators' tap; the dispatcher's
/// drain acks it). With Redis down, the queue's confirmed copy is what makes it durable, and the
/// drain stores it once Redis is back.
pub(crate) async fn publish_dead_letter(cx: &Cx<'_>, id: &str, record: &DeadLetterRecord, kind: &str) -> Settle {
    let stored = match cx.store.dead_letters().save_dead_letter(id, record, now_ms()).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(dead_letter_id = %id, error = %e, "dead letter not stored in Redis; queued for the drain");
            false
        }
    };
    let body = serde_json::to_vec(record).expect("a record serialises");
    let mut headers = trace_headers();
    headers.insert("x-fleet-dead-letter-reason".into(), long_string(record.reason.as_str()));
    headers.insert(dead_letters::STORED_HEADER.into(), AMQPValue::Boolean(stored));
    let properties = BasicProperties::default()
        .with_content_type(CONTENT_TYPE.into())
        .with_delivery_mode(2)
        .with_message_id(ShortString::from(id))
        .with_type(RECORD_MESSAGE_TYPE.into())
        .with_headers(headers);
    let exchange = cx.config.common.topology.dead_letter_exchange();
    match cx.publisher.publish(&exchange, "", &body, properties).await {
        Err(e) if !stored => {
            tracing::warn!(dead_letter_id = %id, error = %e, "cannot publish dead letter");
            return Settle::Requeue;
        }
        Err(e) => tracing::debug!(dead_letter_id = %id, error = %e, "dead letter stored; its queue copy failed"),
        Ok(()) => {}
    }
    cx.metrics.dead_letters.with_label_values(&[kind, record.reason.as_str()]).inc();
    Settle::Ack
}

fn observe_latency(cx: &Cx<'_>, envelope: &Envelope, outcome: &str) {
    let secs = (now_ms() - envelope.enqueued_at_ms).max(0) as f64 / 1000.0;
    cx.metrics.job_latency.with_label_values(&[envelope.kind().as_str(), outcome]).observe(secs);
}

/// The `jobs_finished` outcome of a dead letter.
fn dead_letter_label(reason: DeadLetterReason) -> &'static str {
    match reason {
        DeadLetterReason::Permanent => "permanent",
        DeadLetterReason::Exhausted => "dead_letter",
        DeadLetterReason::Poison => "poison",
        DeadLetterReason::DeliveryLimit => "delivery_limit",
    }
}

fn long_string(text: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(text.as_bytes().to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dead_letter_reason_has_its_own_label() {
        let reasons = [
            DeadLetterReason::Permanent,
            DeadLetterReason::Exhausted,
            DeadLetterReason::Poison,
            DeadLetterReason::DeliveryLimit,
        ];
        let labels: std::collections::HashSet<_> = reasons.iter().map(|r| dead_letter_label(*r)).collect();
        assert_eq!(labels.len(), reasons.len());
    }
}
