//! How a turn ends. Finished: its exchange joins the session's history, the session goes to the
//! next turn (or the turn goes on with steers that arrived), the client gets the message, and
//! subscribers get `agent.room.message`. Abandoned (a dead letter of any kind): the client gets the
//! error, the turn is marked so no step runs again, and its session moves on.

use serde_json::json;

use fleet_platform::broker::Publisher;
use fleet_platform::now_ms;
use fleet_platform::store::SessionFinish;
use fleet_protocol::deadletter::{DeadLetterReason, DeadLetterRecord};
use fleet_protocol::envelope::{Envelope, TurnJob};
use fleet_protocol::events;
use fleet_protocol::execution::ExecutionStatus;
use fleet_protocol::history;
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::turn::{self, Completion, Message, TurnState, FINAL_FENCE};

use super::super::release_and_park;
use super::session::wake;
use super::{complete_step, continue_turn, emit};
use crate::process::Processor;
use crate::settle::{Held, Outcome};

pub(super) async fn finish(
    p: &Processor,
    publisher: &Publisher,
    envelope: &Envelope,
    state: &mut TurnState,
    held: &Held,
    completion: Completion,
) -> Outcome {
    let turn_id = &envelope.execution_id;
    let mut message = json!({
        "id": state.message_id,
        "role": "assistant",
        "content": completion.content,
        "tool_calls": [],
        "created_at": rfc3339_from_millis(now_ms()),
    });
    // `length`: the answer was cut at max_tokens, and the client must be able to tell.
    if let Some(reason) = &completion.finish_reason {
        message["finish_reason"] = json!(reason);
    }
    state.conversation.push(Message::text("assistant", &completion.content));
    state.round += 1;
    remember(p, turn_id, state).await;
    if let Ok(SessionFinish::SteerPending) = p.store.session_finish(&state.session_id, turn_id).await {
        // Steers arrived while the model answered: the turn keeps its session and goes on.
        return match p.store.save_turn_fenced(turn_id, Some(state), held.fence).await {
            Ok(true) if continue_turn(p, publisher, turn_id, state).await.is_ok() => {
                complete_step(p, held, "success").await
            }
            Ok(false) => Outcome::Fenced,
            _ => release_and_park(p, held).await,
        };
    }
    state.final_message = Some(message.clone());
    match p.store.save_turn_fenced(turn_id, Some(state), held.fence).await {
        Ok(true) => {}
        Ok(false) => return Outcome::Fenced,
        Err(_) => return release_and_park(p, held).await,
    }
    emit(p, &state.session_id, turn::message_complete_event(&message)).await;
    emit(p, &state.session_id, turn::done_event(&state.message_id)).await;
    after_redelivery(p, publisher, turn_id, state, held).await
}

/// The end of a finished turn that must hold however often it runs: the record says succeeded,
/// subscribers are told (delivery ids derive from the turn), the session's next turn is woken.
pub(super) async fn after_redelivery(
    p: &Processor,
    publisher: &Publisher,
    turn_id: &str,
    state: &TurnState,
    held: &Held,
) -> Outcome {
    let message = state.final_message.clone().unwrap_or_default();
    let _ = p.store.mark_succeeded(turn_id, &json!({"message": message}), now_ms()).await;
    let payload = json!({"event": events::AGENT_ROOM_MESSAGE, "data": {"room_id": state.session_id, "assistant_id": state.assistant.id, "execution_id": turn_id, "message": message}});
    if let Err(e) = p.notify(publisher, turn_id, events::AGENT_ROOM_MESSAGE, payload).await {
        tracing::warn!(error = %e, "cannot publish the agent.room.message deliveries; the step comes back");
        return release_and_park(p, held).await;
    }
    match p.store.session_finish(&state.session_id, turn_id).await {
        Ok(SessionFinish::Released { next: Some(next) }) => {
            if let Err(e) = wake(p, publisher, &next, &state.session_id).await {
                tracing::debug!(error = %e, "the next turn's parked job comes back by itself");
            }
        }
        Ok(_) => {}
        Err(_) => return release_and_park(p, held).await,
    }
    complete_step(p, held, "success").await
}

/// Appends what the turn said since its last append to the session's history, while it still
/// holds the session, so the next turn reads it. Once per (turn, round): a finish run twice
/// appends once.
async fn remember(p: &Processor, turn_id: &str, state: &mut TurnState) {
    let (first, own) = state.unremembered();
    let created_at = rfc3339_from_millis(now_ms());
    let entries = history::exchange_entries(turn_id, first, own, &state.message_id, &created_at);
    let append_id = format!("{turn_id}:{}", state.round);
    let (max_messages, max_bytes) = (p.config.history_max_messages, p.config.history_max_bytes);
    match p.store.history_append(&state.session_id, &append_id, &entries, max_messages, max_bytes).await {
        Ok(()) => state.remembered = first + entries.len(),
        Err(e) => tracing::warn!(error = %e, "cannot append the turn to its session's history"),
    }
}

/// A turn that ends as a dead letter (model failure, too many rounds, delivery limit): the client
/// is told, no step of it runs again until a replay, its session moves on — and turns that had
/// steered into it run on their own, first in line.
pub(crate) async fn abandon(
    p: &Processor,
    publisher: &Publisher,
    envelope: &Envelope,
    job: &TurnJob,
    dead: &DeadLetterRecord,
    code: Option<&'static str>,
) -> Result<(), String> {
    let code = code.unwrap_or(failure_code(dead.reason));
    end_turn(p, publisher, &envelope.execution_id, &job.session_id, code, &dead.last_error).await
}

/// A turn a client cancelled (`POST /v1/executions/{id}/cancel`), found by its step before the
/// model call: it ends like an abandoned one (error `cancelled`, then `done`; its session moves
/// on), its record says `cancelled`, and the step is marked run so no copy of it runs again.
pub(super) async fn cancel(
    p: &Processor,
    publisher: &Publisher,
    envelope: &Envelope,
    job: &TurnJob,
    held: &Held,
) -> Outcome {
    let turn_id = &envelope.execution_id;
    tracing::info!("the turn was cancelled; it ends before its model call");
    // The status first: a copy of this step that runs after the turn ended would not write it.
    if p.store.set_status(turn_id, ExecutionStatus::Cancelled, None, now_ms(), Some(held.fence)).await.is_err() {
        return release_and_park(p, held).await;
    }
    let _ = p.store.mark_started(turn_id, envelope.kind().as_str()).await;
    let error = "the turn was cancelled";
    if end_turn(p, publisher, turn_id, &job.session_id, "cancelled", error).await.is_err() {
        return release_and_park(p, held).await;
    }
    complete_step(p, held, "cancelled").await
}

/// Ends a turn that will not finish: the client gets `error` (`code`) and `done` once, the turn is
/// marked so no step of it runs again, and its session moves on to the next turn in line.
async fn end_turn(
    p: &Processor,
    publisher: &Publisher,
    turn_id: &str,
    session_id: &str,
    code: &str,
    error: &str,
) -> Result<(), String> {
    let state = p.store.load_turn(turn_id).await.map_err(|e| e.to_string())?;
    if let Some(mut state) = state.filter(|s| !s.dead_lettered) {
        emit(p, session_id, turn::error_event(code, error, None, &state.message_id)).await;
        emit(p, session_id, turn::done_event(&state.message_id)).await;
        state.dead_lettered = true;
        p.store.save_turn_fenced(turn_id, Some(&state), FINAL_FENCE).await.map_err(|e| e.to_string())?;
    }
    let next = p.store.session_abandon(session_id, turn_id).await.map_err(|e| e.to_string())?;
    match next {
        Some(next) => wake(p, publisher, &next, session_id).await,
        None => Ok(()),
    }
}

/// The `error` event code of a turn that ends as a dead letter.
fn failure_code(reason: DeadLetterReason) -> &'static str {
    match reason {
        DeadLetterReason::Exhausted => "llm_unavailable",
        DeadLetterReason::Permanent => "llm_error",
        DeadLetterReason::DeliveryLimit => "delivery_limit",
        DeadLetterReason::Poison => "poison",
    }
}
