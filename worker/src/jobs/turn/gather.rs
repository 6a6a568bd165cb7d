//! What a step's model call sees besides the turn's own conversation: the session's history (first
//! step, read under the session's lock), the previous round's tool results, and steers; then the
//! model call begins: its message id, and the state saved under the claim before anything streams,
//! so a retried or re-run call sees the same conversation and a steer is taken exactly once (the
//! request itself goes out beside that save; its tokens wait for it).

use std::collections::BTreeSet;

use serde_json::json;

use fleet_platform::store::{ClaimAfter, Opened, Transition};
use fleet_protocol::execution::{field, ExecutionStatus};
use fleet_protocol::history::HistoryEntry;
use fleet_protocol::turn::{self, CallOutcome, Message, Steer, StreamingCall, TurnState};

use super::{emit, ClaimedStep};
use crate::outcome::Outcome;

/// Gathers what the model must see into the state, in memory only: nothing is written, so a step
/// parked now (by its provider's budget) gathers it again when it comes back. `opened` is what
/// the step read as it took its session. Returns the turns whose steers it took, for `begin`.
pub(super) async fn collect(
    step: &ClaimedStep<'_>,
    state: &mut TurnState,
    opened: Opened,
) -> Result<Vec<String>, Outcome> {
    let cx = &step.cx;
    // Read only on a first step whose state has not taken it yet (`session::take`).
    if let Some(history) = opened.history {
        state.insert_history(history.iter().map(HistoryEntry::to_message).collect());
        // A seed 001 agent enters its step as it reads its session (saved with the call's state).
        if state.agent.as_mut().is_some_and(|a| a.enter(opened.step.as_deref())) {
            state.tell_step();
        }
    }
    if !state.pending.is_empty() {
        let Ok(outcomes) = cx.store.sessions().call_outcomes(step.turn_id()).await else {
            return Err(step.release_and_park().await);
        };
        for call in std::mem::take(&mut state.pending) {
            let missing = CallOutcome { ok: false, result: json!({"error": "no result"}), external: None };
            let outcome = outcomes.get(call.outcome_key()).unwrap_or(&missing);
            let content = turn::tool_message_content(outcome, cx.config.tool_result_max_bytes);
            state.conversation.push(Message {
                role: "tool".into(),
                content: Some(content),
                tool_calls: vec![],
                tool_call_id: Some(call.call_id),
                images: vec![],
                reasoning: None,
            });
        }
        // After the tool results: an image is shown in a user message, which may not come between
        // the calls and their results.
        state.show_images();
    }
    Ok(take_steers(state, &opened.steers))
}

/// Saves the begun call's state (`prepare`) under the claim: nothing of the call streams before
/// this returns. Then the call this attempt abandoned is announced, the steers taken leave the
/// session's list, and the steers the state holds are answered. Answers the steers still
/// unanswered, for the state's next save.
pub(super) async fn begin(
    step: &ClaimedStep<'_>,
    state: &TurnState,
    taken: Vec<String>,
    abandoned: Option<String>,
) -> Result<Vec<String>, Outcome> {
    let cx = &step.cx;
    let begun = Transition::new(ClaimAfter::Keep)
        .status(ExecutionStatus::Running)
        .turn(state)
        .field(field::ATTEMPTS, step.envelope.attempt);
    step.write(&begun).await?;
    if let Some(abandoned) = abandoned {
        let why = "the model call was interrupted (its worker was lost); it is made again under a new message id";
        emit(cx, &state.session_id, turn::retry_event(&abandoned, step.envelope.attempt, "model_call_abandoned", why))
            .await;
    }
    if !taken.is_empty() {
        let trimmed =
            cx.store.sessions().session_trim_steers(&state.session_id, step.turn_id(), step.held.token, &taken).await;
        if let Err(e) = trimmed {
            tracing::debug!(error = %e, "taken steers stay listed; the turn skips them next time");
        }
    }
    Ok(answer_steers(step, &state.steers_unanswered).await)
}

/// The model call's own message id (each call streams under its own), set in memory before its
/// state is saved; answers the call of this same attempt that began before and never finished
/// (its worker was lost), if any: `begin` announces it.
pub(super) fn prepare(step: &ClaimedStep<'_>, state: &mut TurnState) -> Option<String> {
    let abandoned = state.streaming.take().filter(|s| s.attempt == step.envelope.attempt).map(|s| s.message_id);
    state.message_id = turn::model_call_message_id(step.turn_id(), state.model_calls);
    state.model_calls += 1;
    state.streaming = Some(StreamingCall { message_id: state.message_id.clone(), attempt: step.envelope.attempt });
    abandoned
}

/// Moves the waiting steers (`raw`, read with the session) into the conversation, each once (a
/// steer the turn took before, listed still because its trim failed, is skipped); returns the
/// turns they came from. Read, not taken: they leave the session's list only after the state
/// holding them is saved.
fn take_steers(state: &mut TurnState, raw: &[String]) -> Vec<String> {
    let mut from = BTreeSet::new();
    for steer in raw.iter().filter_map(|r| Steer::parse(r)) {
        if !steer.from.is_empty() && state.steers_taken.contains(&steer.from) {
            continue;
        }
        if !steer.from.is_empty() && from.insert(steer.from.clone()) {
            state.steers_taken.push(steer.from.clone());
            state.steers_unanswered.push(steer.from.clone());
        }
        state.conversation.push(steer.message);
    }
    from.into_iter().collect()
}

/// A steer is answered by the turn it joined: its own execution succeeds, pointing here. Answers
/// those not answered (they stay in the state); the answered ones leave it with its next save.
async fn answer_steers(step: &ClaimedStep<'_>, waiting: &[String]) -> Vec<String> {
    let result = json!({"steered": true, "steered_into": step.turn_id()});
    let mut unanswered = Vec::new();
    for from in waiting {
        if step.cx.store.executions().answer_steer(from, &result).await.is_err() {
            unanswered.push(from.clone());
        }
    }
    unanswered
}
