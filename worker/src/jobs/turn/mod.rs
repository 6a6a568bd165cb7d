//! An agent turn's step (one model call) as a linear pipeline: claim the step, take the session,
//! gather what the model must see (history, tool results, steers), call the model with the claim
//! renewed, then fan the tool calls out or finish. Every write after the claim is fenced by
//! `step_fence`, and nothing the turn needs next is acked away before it is durable.

mod fanout;
mod finish;
mod gather;
mod model;
mod session;

use serde_json::{json, Value};

use fleet_platform::broker::Publisher;
use fleet_platform::now_ms;
use fleet_protocol::envelope::{Envelope, Job, TurnJob};
use fleet_protocol::turn::{self, step_claim_id, step_fence, TurnState};

use super::{claim, release_and_park, Claimed};
use crate::process::Processor;
use crate::settle::{trace_headers, Held, Outcome};

pub(super) use finish::abandon;

pub(super) async fn run(p: &Processor, publisher: &Publisher, envelope: &Envelope, job: &TurnJob) -> Outcome {
    let turn_id = &envelope.execution_id;
    let held = match claim(p, &step_claim_id(turn_id, job.round), |token| step_fence(job.round, token)).await {
        Claimed::Held(held) => held,
        Claimed::Done(_) => return Outcome::Done("duplicate"),
        Claimed::Later(wait) => return Outcome::Parked(wait),
    };
    let mut state = match p.store.load_turn(turn_id).await {
        Ok(Some(state)) if !state.dead_lettered => state,
        Ok(_) => {
            tracing::info!("the turn ended or is gone; the step does nothing");
            let _ = p.store.complete(&held.claim_id, held.token, &json!({"step": "ended"})).await;
            return Outcome::Done("duplicate");
        }
        Err(_) => return release_and_park(p, &held).await,
    };
    if state.round != job.round {
        return fanout::after_redelivery(p, publisher, turn_id, &state, job.round, &held).await;
    }
    // From here on no older copy of this step (or of an earlier one) writes the turn.
    match p.store.save_turn_fenced(turn_id, None, held.fence).await {
        Ok(true) => {}
        Ok(false) => return Outcome::Fenced,
        Err(_) => return release_and_park(p, &held).await,
    }
    match p.store.cancel_requested(turn_id).await {
        Ok(false) => {}
        Ok(true) => return finish::cancel(p, publisher, envelope, job, &held).await,
        Err(_) => return release_and_park(p, &held).await,
    }
    if let Some(outcome) = session::take(p, envelope, job, &state, &held).await {
        return outcome;
    }
    if let Err(outcome) = gather::prepare(p, envelope, job, &mut state, &held).await {
        return outcome;
    }
    if state.round >= p.config.max_rounds {
        let error = format!("the turn took more than {} model rounds", p.config.max_rounds);
        let reason = fleet_protocol::deadletter::DeadLetterReason::Permanent;
        return Outcome::DeadLetter { reason, error, record: None, held: Some(held), code: Some("max_rounds") };
    }
    let completion = match model::call(p, envelope, job, &mut state, &held).await {
        Ok(completion) => completion,
        Err(outcome) => return outcome,
    };
    if completion.tool_calls.is_empty() {
        finish::finish(p, publisher, envelope, &mut state, &held, completion).await
    } else {
        fanout::fan_out(p, publisher, envelope, job, &mut state, &held, completion).await
    }
}

/// Appends an event to the session's stream, with the seed's base fields (`session_id`,
/// `created_at`); best effort: the stream is a view, the record is the truth.
pub(super) async fn emit(p: &Processor, session_id: &str, event: Value) {
    let event = turn::with_base_fields(event, session_id, now_ms());
    if let Err(e) = p.store.publish_event(session_id, &event).await {
        tracing::warn!(error = %e, "cannot publish a stream event");
    }
}

/// Publishes the turn's next step (confirmed); `Err` names what failed.
pub(super) async fn continue_turn(
    p: &Processor,
    publisher: &Publisher,
    turn_id: &str,
    state: &TurnState,
) -> Result<(), String> {
    let step = Job::Turn(TurnJob { session_id: state.session_id.clone(), round: state.round });
    let next = Envelope::new(turn_id.to_string(), step, now_ms());
    publisher.publish_job(&p.config.common.topology, &next, trace_headers()).await.map_err(|e| {
        tracing::warn!(error = %e, "cannot publish the turn's next step");
        format!("cannot publish the turn's next step: {e}")
    })
}

/// Before a model call is retried: the client drops the abandoned attempt's tokens.
pub(super) async fn announce_retry(p: &Processor, envelope: &Envelope, job: &TurnJob, error: &str) {
    let message_id = turn::attempt_message_id(&envelope.execution_id, job.round, envelope.attempt);
    emit(p, &job.session_id, turn::retry_event(&message_id, envelope.attempt, error)).await;
}

/// Marks the step as run: its redelivered or duplicated copies do nothing.
async fn complete_step(p: &Processor, held: &Held, label: &'static str) -> Outcome {
    match p.store.complete(&held.claim_id, held.token, &json!({"step": "done"})).await {
        Ok(false) => Outcome::Fenced,
        // Not marked: a copy would find the turn's round moved on and only check the fan-out.
        Ok(true) | Err(_) => Outcome::Done(label),
    }
}
