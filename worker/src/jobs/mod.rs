//! One module per job kind, dispatched by exhaustive matches: a new kind does not compile until it
//! has its pipeline, its dead-letter aftermath and its retry notice. Each pipeline claims, attempts
//! and returns an `Outcome`; `settle` carries it out.

mod callback_job;
pub(crate) mod circuit;
pub(crate) mod limits;
mod parent;
mod tool_call;
mod turn;
mod webhook;

use std::future::Future;
use std::time::Duration;

use serde_json::Value;

use fleet_platform::broker::Publisher;
use fleet_platform::store::Claim;
use fleet_protocol::deadletter::DeadLetterRecord;
use fleet_protocol::envelope::{Envelope, Job};

use crate::process::Processor;
use crate::settle::{Held, Outcome};

pub(crate) async fn run(p: &Processor, publisher: &Publisher, envelope: &Envelope) -> Outcome {
    match &envelope.job {
        Job::ToolCall(call) => tool_call::run(p, publisher, envelope, call).await,
        Job::Webhook(_) => webhook::run(p, publisher, envelope).await,
        // Boxed: a turn step's future (the model stream) is several times a callback's, and every
        // job's future would otherwise be as large as the largest kind's while it waits.
        Job::Turn(step) => Box::pin(turn::run(p, publisher, envelope, step)).await,
    }
}

/// What a job's dead letter does besides the record: tool calls emit their failure events and
/// tell their turn; a turn tells its client and frees its session.
pub(crate) async fn aftermath(
    p: &Processor,
    publisher: &Publisher,
    envelope: &Envelope,
    dead: &DeadLetterRecord,
    code: Option<&'static str>,
) -> Result<(), String> {
    match &envelope.job {
        Job::ToolCall(call) => tool_call::aftermath(p, publisher, call, dead).await,
        Job::Webhook(_) => Ok(()),
        Job::Turn(step) => turn::abandon(p, publisher, envelope, step, dead, code).await,
    }
}

/// Told before an attempt is retried: a turn's client drops the abandoned attempt's tokens.
pub(crate) async fn before_retry(p: &Processor, envelope: &Envelope, error: &str) {
    match &envelope.job {
        Job::Turn(step) => turn::announce_retry(p, envelope, step, error).await,
        Job::ToolCall(_) | Job::Webhook(_) => {}
    }
}

/// What claiming a job's work found.
enum Claimed {
    Held(Held),
    /// Already done (a redelivery, duplicate or replay of finished work), with its result.
    Done(Value),
    /// Not now: held by a live claim, or Redis is unavailable (fail closed, no attempt spent).
    Later(Duration),
}

async fn claim(p: &Processor, claim_id: &str, fence: impl Fn(u64) -> u64) -> Claimed {
    match p.store.claim(claim_id, &p.config.worker_id, p.config.claim_lease).await {
        Ok(Claim::Acquired { token }) => {
            Claimed::Held(Held { claim_id: claim_id.to_string(), token, fence: fence(token) })
        }
        Ok(Claim::AlreadyDone { result }) => Claimed::Done(result),
        Ok(Claim::Busy { remaining }) => {
            tracing::info!(remaining_ms = remaining.as_millis() as u64, "claimed by another worker; parked");
            Claimed::Later(remaining)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot claim (Redis unavailable); parked");
            Claimed::Later(p.config.common.retry.delays()[0])
        }
    }
}

/// Runs `work` while renewing the claim every third of the lease. `None`: a newer claim took the
/// job meanwhile and `stop_when_lost` dropped the work.
async fn renewing<T>(p: &Processor, held: &Held, stop_when_lost: bool, work: impl Future<Output = T>) -> Option<T> {
    let lease = p.config.claim_lease;
    tokio::pin!(work);
    let mut renew = tokio::time::interval(lease / 3);
    renew.tick().await;
    loop {
        tokio::select! {
            done = &mut work => return Some(done),
            _ = renew.tick() => {
                // Boxed: the wait it sits beside is what a thousand in-flight jobs hold.
                if let Ok(false) = Box::pin(p.store.renew(&held.claim_id, held.token, lease)).await {
                    tracing::warn!(claim = %held.claim_id, "lease lost to another worker during the attempt");
                    if stop_when_lost {
                        return None;
                    }
                }
            }
        }
    }
}

/// Gives the claim back and parks the job: something it needs failed before any side effect.
async fn release_and_park(p: &Processor, held: &Held) -> Outcome {
    let _ = p.store.release(&held.claim_id, held.token, "released").await;
    Outcome::Parked(p.config.common.retry.delays()[0])
}
