//! The life of a callback job (a tool call or a webhook delivery): the tool's circuit
//! (`circuit.rs`), claim, the tool's limits (`limits.rs`), one signed POST (or a status poll) with
//! the claim renewed, then the outcome. A tool call made by a turn tells its turn when it
//! succeeds, also when a redelivery finds it already done.

use std::time::{Duration, Instant};

use serde_json::Value;

use fleet_platform::broker::Publisher;
use fleet_platform::now_ms;
use fleet_platform::store::{Begin, StoreError};
use fleet_protocol::envelope::{Envelope, PollState, TurnParent};
use fleet_protocol::execution::{AttemptOutcome, AttemptRecord, ExecutionStatus};
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::turn::CallOutcome;

use super::{circuit, claim, limits, parent, renewing, Claimed};
use crate::callback::{self, AttemptVerdict, CallbackContext};
use crate::process::Processor;
use crate::settle::{trace_headers, Failure, Held, Outcome};

/// The turn waiting for a tool call's result, and the tool's name.
pub(super) type Parent<'a> = Option<(&'a TurnParent, &'a str)>;

// Each stage but the attempt's wait is boxed: a job's future is as large as its largest stage, and
// a worker holds a thousand of them while their callbacks wait (14.9 KB each unboxed).
pub(super) async fn run(p: &Processor, publisher: &Publisher, envelope: &Envelope, parent: Parent<'_>) -> Outcome {
    let id = &envelope.execution_id;
    let kind = envelope.kind().as_str();
    let gate = match Box::pin(circuit::admit(p, publisher, envelope)).await {
        Ok(gate) => gate,
        Err(deferred) => return deferred,
    };
    let held = match Box::pin(claim(p, id, |token| token)).await {
        Claimed::Held(held) => held,
        Claimed::Done(result) => return Box::pin(already_done(p, publisher, envelope, parent, result)).await,
        Claimed::Later(wait) => return Outcome::Parked(wait),
    };
    // The tool's limits are checked after the claim and before the attempt's first record write.
    // After the claim: a duplicate of a finished call, or a copy whose twin is running, ends or
    // parks at the claim without taking a concurrency slot or a rate slot from real work, and only
    // the claim's holder holds a slot (named with its token, so a fenced-off copy never frees the
    // newer claim's). Before `begin`: a deferred call has sent and written nothing (its record
    // stays queued or retrying, its attempt is not spent), and it gives its claim back before it
    // is parked, so no claim lease is held while it waits in the broker. The cost: each return of
    // a deferred call claims and releases again.
    let admission = match Box::pin(limits::admit(p, envelope, &held)).await {
        Ok(admission) => admission,
        Err(deferred) => return deferred,
    };
    // A poll continues the attempt its POST started.
    let started_ms = envelope.poll.as_ref().map_or_else(now_ms, |poll| poll.started_at_ms);
    if let Err(outcome) = Box::pin(begin(p, publisher, envelope, parent, &held, started_ms)).await {
        limits::release(p, admission).await;
        return outcome;
    }
    p.metrics.jobs_started.with_label_values(&[kind]).inc();
    let clock = Instant::now();
    let ctx = CallbackContext {
        store: &p.store,
        targets: &p.targets,
        callback_timeout: p.config.callback_timeout,
        client: &p.client,
        secrets: &p.config.secrets_key,
        poll_limit: p.config.async_poll_limit,
    };
    let attempt = Box::pin(callback::attempt(&ctx, id, &envelope.job, envelope.poll.as_ref()));
    let attempt = limits::holding(p, &admission, attempt);
    let report = renewing(p, &held, false, attempt).await.expect("callbacks are not stopped by a lost lease");
    limits::release(p, admission).await;
    let elapsed = clock.elapsed();
    p.metrics.attempt_duration.with_label_values(&[kind]).observe(elapsed.as_secs_f64());
    p.metrics.callback_responses.with_label_values(&[kind, report.class]).inc();
    tracing::info!(http_status = report.http_status, error = report.error.as_deref(), "attempt finished");
    let record = AttemptRecord {
        attempt: envelope.attempt,
        started_at: rfc3339_from_millis(started_ms),
        duration_ms: elapsed.as_millis() as u64,
        http_status: report.http_status,
        error: report.error.clone(),
        outcome: AttemptOutcome::Success,
        prompt_tokens: None,
        completion_tokens: None,
    };
    let error = report.error.clone().unwrap_or_else(|| "failed".into());
    let failure = |retry_after, permanent| {
        Outcome::Failed(Failure {
            record: record.clone(),
            error,
            retry_after,
            permanent,
            held: held.clone(),
            started_ms,
        })
    };
    if let Some(outcome) = Box::pin(circuit::after_attempt(p, envelope, gate, &report, &record, &held)).await {
        return outcome;
    }
    match report.verdict {
        AttemptVerdict::Succeeded(result) => {
            Box::pin(succeed(p, publisher, envelope, parent, &held, &record, result)).await
        }
        AttemptVerdict::Retryable { retry_after } => failure(retry_after, false),
        AttemptVerdict::Permanent => failure(None, true),
        AttemptVerdict::Accepted(poll) => Box::pin(poll_later(p, publisher, envelope, &held, &poll)).await,
    }
}

/// The attempt's first record write, `running`: it registers this claim's token before anything
/// is sent, so an older worker can no longer write over it, and it loses to a cancel that came
/// first (also one of the parent turn's: its still-queued calls are cancelled with it). `Err` is
/// how the job ends instead.
async fn begin(
    p: &Processor,
    publisher: &Publisher,
    envelope: &Envelope,
    parent: Parent<'_>,
    held: &Held,
    started_ms: i64,
) -> Result<(), Outcome> {
    let id = &envelope.execution_id;
    if let Some((turn, _)) = parent {
        if let Ok(true) = p.store.cancel_requested(&turn.turn_execution_id).await {
            let _ = p.store.request_cancel(id, now_ms()).await;
        }
    }
    // Independent writes go together.
    let running = p.store.begin_attempt(id, envelope.attempt, started_ms, held.fence);
    let started = async {
        if envelope.attempt == 1 {
            let _ = p.store.mark_started(id, envelope.kind().as_str()).await;
        }
    };
    match tokio::join!(running, started) {
        (Ok(Begin::Started), ()) => Ok(()),
        (Ok(Begin::Fenced), ()) => Err(Outcome::Fenced),
        (Ok(Begin::Cancelled), ()) => Err(cancelled(p, publisher, parent, held).await),
        (Err(e), ()) => {
            tracing::warn!(error = %e, "cannot record the attempt's start; parked");
            Err(super::release_and_park(p, held).await)
        }
    }
}

/// A cancelled job: nothing is sent. The claim is given back (not done: a copy finds the record
/// cancelled too), and a turn's call tells its turn, which must not wait for it.
async fn cancelled(p: &Processor, publisher: &Publisher, parent: Parent<'_>, held: &Held) -> Outcome {
    tracing::info!("cancelled before its attempt; nothing sent");
    if !p.release(held, "cancelled").await {
        return Outcome::Fenced;
    }
    let Some((turn, tool_name)) = parent else { return Outcome::Done("cancelled") };
    let error = serde_json::json!({"error": "the tool call was cancelled before it was sent", "cancelled": true});
    let outcome = CallOutcome { ok: false, result: error };
    match parent::tool_call_finished(p, publisher, turn, tool_name, outcome).await {
        Ok(()) => Outcome::Done("cancelled"),
        Err(_) => Outcome::Parked(p.config.common.retry.delays()[0]),
    }
}

async fn succeed(
    p: &Processor,
    publisher: &Publisher,
    envelope: &Envelope,
    parent: Parent<'_>,
    held: &Held,
    record: &AttemptRecord,
    result: Value,
) -> Outcome {
    let id = &envelope.execution_id;
    match store_result(p, id, held, &result).await {
        Ok(true) => {}
        Ok(false) => return Outcome::Fenced,
        Err(e) => {
            // The callback ran but its result is not stored: run the attempt again later.
            tracing::warn!(error = %e, "cannot store result; requeued");
            return Outcome::Requeue;
        }
    }
    let recorded =
        p.store.record_attempt(id, record, ExecutionStatus::Succeeded, Some(&result), now_ms(), Some(held.fence)).await;
    match recorded {
        Ok(true) => {}
        Ok(false) => return Outcome::Fenced,
        Err(e) => {
            // The result is stored; the record is not. The redelivery finds the result (nothing
            // runs again) and repairs the record.
            tracing::warn!(error = %e, "result stored but not recorded; requeued");
            return Outcome::Requeue;
        }
    }
    tell_parent(p, publisher, parent, result, "success").await
}

/// Stores the result under the claim, retrying while Redis is unavailable (a failover takes
/// seconds) for up to a third of the lease: the lease was renewed at most a third ago, so the claim
/// still holds throughout. Giving up sooner would requeue a job whose callback has run, and its
/// next delivery would wait the lease out and call the tool owner again.
async fn store_result(p: &Processor, id: &str, held: &Held, result: &Value) -> Result<bool, StoreError> {
    let deadline = Instant::now() + p.config.claim_lease / 3;
    let mut pause = Duration::from_millis(100);
    loop {
        match p.store.complete(id, held.token, result).await {
            Err(e) if Instant::now() + pause < deadline => {
                tracing::debug!(error = %e, "cannot store the result yet; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            stored => return stored,
        }
    }
}

/// A redelivery, duplicate publish or replay of a finished job: nothing runs again, but the record
/// is repaired and the parent turn told (both may have been cut short).
async fn already_done(
    p: &Processor,
    publisher: &Publisher,
    envelope: &Envelope,
    parent: Parent<'_>,
    result: Value,
) -> Outcome {
    let id = &envelope.execution_id;
    p.metrics.idempotency_hits.with_label_values(&[envelope.kind().as_str()]).inc();
    let repaired = match p.store.get_execution(id).await {
        Ok(Some(view)) if view.status == ExecutionStatus::Succeeded => Ok(()),
        Ok(_) => p.store.mark_succeeded(id, &result, now_ms()).await,
        Err(e) => Err(e),
    };
    if let Err(e) = repaired {
        tracing::warn!(error = %e, "cannot repair the execution record; parked");
        return Outcome::Parked(p.config.common.retry.delays()[0]);
    }
    tracing::info!("already succeeded; not run again");
    tell_parent(p, publisher, parent, result, "duplicate").await
}

async fn tell_parent(
    p: &Processor,
    publisher: &Publisher,
    parent: Parent<'_>,
    result: Value,
    label: &'static str,
) -> Outcome {
    let Some((turn, tool_name)) = parent else { return Outcome::Done(label) };
    let outcome = CallOutcome { ok: true, result };
    match parent::tool_call_finished(p, publisher, turn, tool_name, outcome).await {
        Ok(()) => Outcome::Done(label),
        // Done, but its turn does not know yet: the job comes back, finds itself done, tells again.
        Err(_) => Outcome::Parked(p.config.common.retry.delays()[0]),
    }
}

/// A 202 (or a poll still pending): the attempt goes on in the broker, not in a sleeping task.
/// The claim is released as `polling` (not done), and the job, carrying the status URL and
/// deadline, returns after the poll interval to GET the status URL. No attempt is spent.
async fn poll_later(
    p: &Processor,
    publisher: &Publisher,
    envelope: &Envelope,
    held: &Held,
    poll: &PollState,
) -> Outcome {
    if !p.release(held, "polling").await {
        return Outcome::Fenced;
    }
    let interval = p.config.async_poll_interval;
    let next = Envelope {
        first_attempt_at_ms: Some(envelope.first_attempt_at_ms.unwrap_or(poll.started_at_ms)),
        not_before_ms: Some(now_ms() + interval.as_millis() as i64),
        poll: Some(poll.clone()),
        ..envelope.clone()
    };
    let queue = p.config.common.topology.delay_queue(envelope.kind(), p.config.common.retry.park_step(interval));
    match publisher.publish_delayed(&queue, &next, trace_headers()).await {
        Ok(()) => Outcome::Done("polling"),
        Err(e) => {
            tracing::warn!(error = %e, "cannot park the status poll; requeued");
            Outcome::Requeue
        }
    }
}
