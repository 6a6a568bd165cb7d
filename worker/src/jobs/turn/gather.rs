//! What a step's model call sees besides the turn's own conversation: the session's history (first
//! step, read under the session's lock), the previous round's tool results, and steers. The state
//! is saved (fenced) before the model call, so a retried call sees the same conversation and a
//! taken steer is never lost.

use std::collections::BTreeSet;

use serde_json::json;

use fleet_platform::now_ms;
use fleet_protocol::envelope::{Envelope, JobKind, TurnJob};
use fleet_protocol::execution::ExecutionStatus;
use fleet_protocol::history::HistoryEntry;
use fleet_protocol::turn::{self, step_claim_id, CallOutcome, Message, Steer, TurnState};

use super::super::release_and_park;
use crate::process::Processor;
use crate::settle::{Held, Outcome};

pub(super) async fn prepare(
    p: &Processor,
    envelope: &Envelope,
    job: &TurnJob,
    state: &mut TurnState,
    held: &Held,
) -> Result<(), Outcome> {
    let turn_id = &envelope.execution_id;
    if job.round == 0 && envelope.attempt == 1 {
        let _ = p.store.mark_started(turn_id, JobKind::Turn.as_str()).await;
    }
    if job.round == 0 {
        match p.store.history(&state.session_id).await {
            Ok(history) => state.insert_history(history.iter().map(HistoryEntry::to_message).collect()),
            Err(_) => return Err(release_and_park(p, held).await),
        }
    }
    if !state.pending.is_empty() {
        let Ok(outcomes) = p.store.call_outcomes(turn_id).await else {
            return Err(release_and_park(p, held).await);
        };
        for call in std::mem::take(&mut state.pending) {
            let missing = CallOutcome { ok: false, result: json!({"error": "no result"}) };
            let outcome = outcomes.get(&call.call_id).unwrap_or(&missing);
            let content = turn::tool_message_content(outcome, p.config.tool_result_max_bytes);
            state.conversation.push(Message {
                role: "tool".into(),
                content: Some(content),
                tool_calls: vec![],
                tool_call_id: Some(call.call_id),
            });
        }
    }
    let steered = take_steers(p, state).await;
    match p.store.save_turn_fenced(turn_id, Some(state), held.fence).await {
        Ok(true) => {}
        Ok(false) => return Err(Outcome::Fenced),
        Err(_) => return Err(release_and_park(p, held).await),
    }
    answer_steers(p, turn_id, &steered).await;
    let _ =
        p.store.set_status(turn_id, ExecutionStatus::Running, Some(envelope.attempt), now_ms(), Some(held.fence)).await;
    Ok(())
}

/// Moves waiting steers into the conversation; returns the turns they came from.
async fn take_steers(p: &Processor, state: &mut TurnState) -> BTreeSet<String> {
    let mut from = BTreeSet::new();
    let raw = match p.store.session_take_steer(&state.session_id).await {
        Ok(raw) => raw,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read steers; the next model call reads them");
            return from;
        }
    };
    for steer in raw.iter().filter_map(|r| Steer::parse(r)) {
        if !steer.from.is_empty() {
            from.insert(steer.from);
        }
        state.conversation.push(steer.message);
    }
    from
}

/// A steer is answered by the turn it joined: its own execution succeeds, pointing there, and its
/// step is done.
async fn answer_steers(p: &Processor, turn_id: &str, steered: &BTreeSet<String>) {
    for from in steered {
        let result = json!({"steered": true, "steered_into": turn_id});
        let _ = p.store.mark_succeeded(from, &result, now_ms()).await;
        let _ = p.store.force_done(&step_claim_id(from, 0), &result).await;
    }
}
