//! The one hook for "a tool call a turn made has ended", called however it ended (success, a
//! redelivery of a success, dead letter, delivery limit): the outcome is recorded on the turn, and
//! the call that completes the round publishes the turn's next step.

use fleet_platform::broker::Publisher;
use fleet_protocol::envelope::TurnParent;
use fleet_protocol::turn::{self, CallOutcome};

use crate::process::Processor;

/// `Err` means the turn may not know yet: the caller must not ack its job away.
pub(crate) async fn tool_call_finished(
    p: &Processor,
    publisher: &Publisher,
    parent: &TurnParent,
    tool_name: &str,
    outcome: CallOutcome,
) -> Result<(), String> {
    let turn_id = &parent.turn_execution_id;
    let recorded = p.store.record_call_outcome(turn_id, &parent.call_id, &outcome).await;
    let (first, outcomes) = recorded.map_err(|e| {
        tracing::warn!(error = %e, "cannot record a tool result for its turn");
        e.to_string()
    })?;
    let state = match p.store.load_turn(turn_id).await {
        Ok(Some(state)) => state,
        Ok(None) => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    if first {
        let event = if outcome.ok {
            turn::tool_result_event(&parent.call_id, tool_name, &outcome, &state.message_id)
        } else {
            let error = outcome.result.to_string();
            let code = if outcome.result["cancelled"] == true { "cancelled" } else { "tool_callback_failed" };
            turn::error_event(code, &error, Some(&parent.call_id), &state.message_id)
        };
        super::turn::emit(p, &state.session_id, event).await;
    }
    let round_complete = state.pending.iter().all(|call| outcomes.contains_key(&call.call_id));
    if state.round == parent.round + 1 && round_complete && !state.dead_lettered {
        super::turn::continue_turn(p, publisher, turn_id, &state).await?;
    }
    Ok(())
}
