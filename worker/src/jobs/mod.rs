//! One module per job kind, dispatched by exhaustive matches: a new kind does not compile until it
//! has its pipeline, its dead-letter aftermath and its retry notice. Each pipeline claims, attempts
//! and returns an `Outcome`; `settle` carries it out. Nothing here imports `settle` or `delivery`.

mod approval;
mod callback_job;
pub(crate) mod circuit;
pub(crate) mod claim;
pub(crate) mod limits;
mod owed;
mod parent;
mod stream;
mod tool_call;
mod turn;
mod webhook;

use std::future::Future;

use fleet_protocol::dead_letters::DeadLetterRecord;
use fleet_protocol::envelope::{Envelope, Job, Verdict};

use crate::context::Cx;
use crate::outcome::{DeadLetter, Outcome};

/// Runs the delivery's job by its kind, and what its record owes when the claim finds a copy.
pub(crate) async fn run(cx: &Cx<'_>, envelope: &Envelope) -> Outcome {
    // The one box of a job's future, here where its kind is known, so that it is sized to that
    // kind: a worker holds a thousand of them while they wait, and a turn step's (its model stream)
    // is many times a callback's, which would otherwise size every job's task.
    match &envelope.job {
        Job::ToolCall(call) => Box::pin(carrying_owed(cx, envelope, || tool_call::run(cx, envelope, call))).await,
        Job::Webhook(_) => Box::pin(carrying_owed(cx, envelope, || webhook::run(cx, envelope))).await,
        Job::Turn(step) => Box::pin(carrying_owed(cx, envelope, || turn::run(cx, envelope, step))).await,
    }
}

/// The outcome of `job`, or, when the claim found a copy of an earlier step and the record owes
/// something, what carrying it out ends in. `job` is made here, not passed in made: a future taken
/// by value would be laid out twice in this one.
async fn carrying_owed<F: Future<Output = Outcome>>(
    cx: &Cx<'_>,
    envelope: &Envelope,
    job: impl FnOnce() -> F,
) -> Outcome {
    match job().await {
        Outcome::Owed(owed, result) => owed::carry(cx, envelope, owed, result).await,
        other => other,
    }
}

/// What a copy carries out for the record (see `owed`).
pub(crate) async fn carry(
    cx: &Cx<'_>,
    envelope: &Envelope,
    owed: fleet_protocol::life::Owed,
    result: Option<serde_json::Value>,
) -> Outcome {
    owed::carry(cx, envelope, owed, result).await
}

/// A job whose end is decided before it runs (it kept losing its worker, or the broker gave up on
/// it; `envelope` carries the verdict): claimed like any delivery, so a copy stays a copy, even from
/// the live lease of a worker that died, then dead-lettered under the claim.
pub(crate) async fn decided(cx: &Cx<'_>, envelope: &Envelope, verdict: Verdict) -> Outcome {
    // Boxed as `run` boxes a kind's job: a decided job is dispatched here instead, and its future
    // need not size every job's task.
    Box::pin(dead_letter_decided(cx, envelope, verdict)).await
}

async fn dead_letter_decided(cx: &Cx<'_>, envelope: &Envelope, verdict: Verdict) -> Outcome {
    tracing::warn!(reason = verdict.reason.as_str(), "the job's end is decided; it is dead-lettered without running");
    match claim::admit(cx, envelope, claim::Mode::Take).await {
        Ok(claim::Claim::Step { held, .. }) => Outcome::DeadLetter(DeadLetter {
            reason: verdict.reason,
            error: verdict.error,
            record: None,
            held: Some(held),
            code: None,
        }),
        Ok(claim::Claim::Owed { owed, result }) => owed::carry(cx, envelope, owed, result).await,
        Ok(claim::Claim::Cancelled) => cancelled(cx, envelope).await,
        Err(outcome) => outcome,
    }
}

/// A job whose execution was cancelled before this step ran: nothing is sent; a turn's call
/// tells its turn, which must not wait for it.
async fn cancelled(cx: &Cx<'_>, envelope: &Envelope) -> Outcome {
    match &envelope.job {
        Job::ToolCall(call) => tool_call::cancelled(cx, envelope, call).await,
        Job::Webhook(_) => Outcome::Done(crate::outcome::Finished::Cancelled),
        Job::Turn(_) => Outcome::Copy,
    }
}

/// What a job's dead letter does besides the record: tool calls emit their failure events and
/// tell their turn; a turn tells its client and frees its session.
pub(crate) async fn aftermath(
    cx: &Cx<'_>,
    envelope: &Envelope,
    dead: &DeadLetterRecord,
    code: Option<&'static str>,
) -> Result<(), String> {
    match &envelope.job {
        Job::ToolCall(call) => tool_call::aftermath(cx, envelope, call, dead).await,
        Job::Webhook(_) => Ok(()),
        Job::Turn(step) => turn::abandon(cx, envelope, step, dead, code).await,
    }
}

/// Told before an attempt is retried: a turn's client drops the abandoned attempt's tokens.
pub(crate) async fn before_retry(cx: &Cx<'_>, envelope: &Envelope, error: &str) {
    match &envelope.job {
        Job::Turn(step) => turn::announce_retry(cx, envelope, step, error).await,
        Job::ToolCall(_) | Job::Webhook(_) => {}
    }
}
