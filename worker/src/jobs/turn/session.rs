//! A turn and its session: one turn at a time per session, in arrival order; a `steer` turn that
//! finds the session busy hands its messages to the running turn instead of waiting. The lock
//! carries the token of the step holding it, so an older step of the turn cannot act for it.

use fleet_platform::now_ms;
use fleet_platform::store::{ClaimAfter, Opened, SessionSlot, Transition};
use fleet_protocol::envelope::{Envelope, Job, TurnJob};
use fleet_protocol::turn::{self, Steer, TurnState};

use super::ClaimedStep;
use crate::context::Cx;
use crate::outcome::{Finished, Outcome};
use crate::publish::{publish_holding, trace_headers};

/// Takes the session for the step, reading with it what the model call sees (the history on the
/// turn's first step, the waiting steers); `Err` is how the step ends when it cannot run now.
pub(super) async fn take(step: &ClaimedStep<'_>, state: &TurnState) -> Result<Opened, Outcome> {
    let cx = &step.cx;
    let with_history = step.job.round == 0 && !state.history_read;
    match cx.store.sessions().session_acquire(&state.session_id, step.turn_id(), step.held.token, with_history).await {
        Ok(SessionSlot::Acquired(opened)) => Ok(opened),
        Ok(SessionSlot::Stale) => Err(Outcome::Fenced),
        Ok(SessionSlot::Wait) if step.job.round == 0 && state.behavior == turn::Behavior::Steer => {
            Err(steer(step, state).await)
        }
        Ok(SessionSlot::Wait) | Err(_) => Err(step.release_and_park().await),
    }
}

/// Hands the turn's user messages to the session's running turn (once, whatever copies of this
/// step arrive). The claim is released, not done: if the running turn fails before reading them,
/// this turn runs on its own.
async fn steer(step: &ClaimedStep<'_>, state: &TurnState) -> Outcome {
    let turn_id = step.turn_id();
    let steers: Vec<String> = state
        .conversation
        .iter()
        .filter(|m| m.role == "user")
        .map(|m| serde_json::to_string(&Steer { from: turn_id.to_string(), message: m.clone() }))
        .filter_map(Result::ok)
        .collect();
    match step.cx.store.sessions().session_steer(&state.session_id, turn_id, &steers).await {
        Ok(true) => match step.write(&Transition::new(ClaimAfter::Release("steered"))).await {
            Ok(()) => Outcome::Done(Finished::Steered),
            Err(stop) => stop,
        },
        Ok(false) | Err(_) => step.release_and_park().await,
    }
}

/// Publishes the step the session's next turn in line expects (its generation, round and attempt,
/// read from its record), holding the delivery until the broker takes it: a turn that had steered
/// into one that failed has no other job to wake it.
pub(super) async fn wake(cx: &Cx<'_>, cause: &Envelope, next: &str, session_id: &str) -> Result<(), Outcome> {
    let expected = match cx.store.executions().expected(next).await {
        Ok(Some(expected)) if !expected.status.is_final() => expected,
        Ok(_) => return Ok(()),
        Err(_) => return Err(Outcome::Parked(cx.soon())),
    };
    let job = Job::Turn(TurnJob { session_id: session_id.to_string(), round: expected.step.round });
    let envelope = Envelope {
        gen: expected.step.gen,
        attempt: expected.step.attempt,
        ..Envelope::new(next.to_string(), job, now_ms())
    };
    let topology = &cx.config.common.topology;
    publish_holding(cx, cause, || cx.publisher.publish_job(topology, &envelope, trace_headers()))
        .await
        .map_err(Outcome::from)
}
