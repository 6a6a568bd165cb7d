//! A turn and its session: one turn at a time per session, in arrival order; a `steer` turn that
//! finds the session busy hands its messages to the running turn instead of waiting.

use fleet_platform::broker::Publisher;
use fleet_platform::now_ms;
use fleet_platform::store::SessionSlot;
use fleet_protocol::envelope::{Envelope, Job, TurnJob};
use fleet_protocol::turn::{self, Steer, TurnState};

use super::super::release_and_park;
use crate::process::Processor;
use crate::settle::{trace_headers, Held, Outcome};

/// Takes the session for the step; `Some` is the outcome when the step cannot run now.
pub(super) async fn take(
    p: &Processor,
    envelope: &Envelope,
    job: &TurnJob,
    state: &TurnState,
    held: &Held,
) -> Option<Outcome> {
    let turn_id = &envelope.execution_id;
    match p.store.session_acquire(&state.session_id, turn_id).await {
        Ok(SessionSlot::Acquired) => None,
        Ok(SessionSlot::Wait) if job.round == 0 && state.behavior == turn::Behavior::Steer => {
            Some(steer(p, turn_id, state, held).await)
        }
        Ok(SessionSlot::Wait) | Err(_) => Some(release_and_park(p, held).await),
    }
}

/// Hands the turn's user messages to the session's running turn. The step's claim is released,
/// not done: if the running turn fails before reading them, this turn runs on its own.
async fn steer(p: &Processor, turn_id: &str, state: &TurnState, held: &Held) -> Outcome {
    let steers: Vec<String> = state
        .conversation
        .iter()
        .filter(|m| m.role == "user")
        .map(|m| serde_json::to_string(&Steer { from: turn_id.to_string(), message: m.clone() }))
        .filter_map(Result::ok)
        .collect();
    match p.store.session_steer(&state.session_id, turn_id, &steers).await {
        Ok(true) => {
            let _ = p.store.release(&held.claim_id, held.token, "steered").await;
            Outcome::Done("steered")
        }
        Ok(false) | Err(_) => release_and_park(p, held).await,
    }
}

/// Publishes the first step of the next turn in a session's line. A waiting turn's own parked job
/// also comes back; a turn that had steered into a failed one has no other job.
pub(super) async fn wake(p: &Processor, publisher: &Publisher, next: &str, session_id: &str) -> Result<(), String> {
    let step = Job::Turn(TurnJob { session_id: session_id.to_string(), round: 0 });
    let envelope = Envelope::new(next.to_string(), step, now_ms());
    publisher
        .publish_job(&p.config.common.topology, &envelope, trace_headers())
        .await
        .map_err(|e| format!("cannot wake the session's next turn: {e}"))
}
