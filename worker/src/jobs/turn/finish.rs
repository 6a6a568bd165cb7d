//! How a turn ends. Finished: the answer is saved with the finish owed (one write), then its
//! exchange joins the session's history and the session goes to the next turn (or the turn goes on
//! with steers that arrived), subscribers get `agent.room.message`, the next turn is woken, the
//! record says `succeeded`, and only then the client gets `message_complete` and `done`. A worker
//! lost anywhere in between leaves the rest owed to the next copy of the step. Abandoned (a dead
//! letter of any kind), cancelled, or over its model's context window: the client gets the error,
//! and its session moves on.

use serde_json::json;

use fleet_platform::now_ms;
use fleet_platform::store::{ClaimAfter, Fence, SessionFinish, Transition};
use fleet_protocol::agent_session;
use fleet_protocol::dead_letters::{DeadLetterReason, DeadLetterRecord};
use fleet_protocol::envelope::{Envelope, Job, TurnJob};
use fleet_protocol::events;
use fleet_protocol::execution::{AttemptRecord, ExecutionStatus};
use fleet_protocol::history;
use fleet_protocol::life::Owed;
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::turn::{self, Completion, Message, TurnState};

use super::session::wake;
use super::{emit, ClaimedStep};
use crate::context::Cx;
use crate::outcome::{Finished, Outcome};
use crate::publish::{publish_next, retire};

pub(super) async fn finish(
    step: &ClaimedStep<'_>,
    state: &mut TurnState,
    completion: Completion,
    record: AttemptRecord,
) -> Outcome {
    let closing = structured_output(state, &completion.content);
    finish_with(step, state, completion, record, closing).await
}

/// The answer's reasoning, kept for the agent's later prompts only if it asks for that.
pub(super) fn replayed_reasoning(state: &TurnState, completion: &Completion) -> Option<String> {
    let replay = state.agent.as_ref().is_some_and(|a| a.config.replay_reasoning);
    (replay && !completion.reasoning.is_empty()).then(|| completion.reasoning.clone())
}

/// A seed 001 agent's answer given under an output schema ends with the checked content
/// (`structured_output`), or with an error naming why it does not match: never a silent pass.
fn structured_output(state: &TurnState, answer: &str) -> Vec<serde_json::Value> {
    let Some((name, schema)) = state.agent.as_ref().and_then(|a| a.config.answer_schema(state.step())) else {
        return vec![];
    };
    let message_id = &state.message_id;
    match fleet_protocol::agent_config::check_answer(name, schema, answer) {
        Ok(content) => vec![agent_session::structured_output_event(name, &content, message_id)],
        Err(problem) => vec![turn::error_event("structured_output_invalid", &problem, None, message_id)],
    }
}

/// The answer of a turn whose model asked for a handoff beyond its agent's transition limit:
/// what it said so far, then the limit's error.
pub(super) async fn finish_beyond_transitions(
    step: &ClaimedStep<'_>,
    state: &mut TurnState,
    completion: Completion,
    record: AttemptRecord,
    limit: u32,
) -> Outcome {
    let closing = vec![agent_session::transition_limit_event(limit, &state.message_id)];
    finish_with(step, state, completion, record, closing).await
}

/// Saves the answer (with the agent's `closing` events, sent before `message_complete`) owing
/// the finish, then completes it.
async fn finish_with(
    step: &ClaimedStep<'_>,
    state: &mut TurnState,
    completion: Completion,
    record: AttemptRecord,
    closing: Vec<serde_json::Value>,
) -> Outcome {
    if let Some(agent) = state.agent.as_mut() {
        agent.closing = closing;
    }
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
    let mut answer = Message::text("assistant", &completion.content);
    answer.reasoning = replayed_reasoning(state, &completion);
    state.conversation.push(answer);
    state.round += 1;
    state.streaming = None;
    state.final_message = Some(message);
    let saved = Transition::new(ClaimAfter::Keep)
        .step(step.envelope.step().next_round())
        .owe(&Owed::TurnFinish)
        .attempt(&record)
        .turn(state);
    if let Err(stop) = step.write(&saved).await {
        return stop;
    }
    complete(&step.cx, step.envelope, state, Fence::Token(step.held.token)).await.unwrap_or_else(|stop| stop)
}

/// The finish a saved answer owes, run by the step that saved it or by a copy (`fence`): the
/// session first (history and lock, or the turn goes on with steers), then subscribers, the next
/// turn, the record, the announcement.
pub(super) async fn complete(
    cx: &Cx<'_>,
    envelope: &Envelope,
    state: &TurnState,
    fence: Fence<'_>,
) -> Result<Outcome, Outcome> {
    if state.compaction.is_some() {
        return super::compact::complete(cx, envelope, state, fence).await;
    }
    let turn_id = &envelope.execution_id;
    let (first, own) = state.unremembered();
    let created_at = rfc3339_from_millis(now_ms());
    let entries = history::exchange_entries(turn_id, first, own, &state.message_id, &created_at);
    let append_id = format!("{turn_id}:{}", state.round);
    let lock_fence = match fence {
        Fence::Token(token) => token,
        // The record owes the finish: no newer step of the turn exists to be fenced from.
        Fence::Owed(_) => u64::MAX,
    };
    let session = &state.session_id;
    remember_tool_outputs(cx, turn_id, state).await?;
    // The message's subscribers are looked up beside the session's finish (one round trip on the
    // connection for both), for the turn as it started.
    let (finished, hooks) = tokio::join!(
        cx.store.sessions().session_finish(session, turn_id, lock_fence, (&append_id, state.step()), &entries),
        cx.subscribers_of(events::AGENT_ROOM_MESSAGE, envelope.enqueued_at_ms),
    );
    let next = match finished.map_err(|_| Outcome::Parked(cx.soon()))? {
        SessionFinish::SteerPending => return go_on(cx, envelope, state, fence).await,
        SessionFinish::Stale => return Err(Outcome::Fenced),
        SessionFinish::Released { next, history } => {
            trim_history(cx, session, history).await;
            next
        }
        SessionFinish::NotHolder { next, free } => next.filter(|_| free),
    };
    let message = state.final_message.clone().unwrap_or_default();
    let payload = json!({"event": events::AGENT_ROOM_MESSAGE, "data": {"room_id": fleet_protocol::tenant::session_key_shown(session), "assistant_id": state.assistant.id, "execution_id": turn_id, "message": message}});
    let hooks = hooks.map_err(|_| Outcome::Parked(cx.soon()))?;
    if let Err(e) = crate::notify::deliver(cx, &hooks, turn_id, events::AGENT_ROOM_MESSAGE, payload).await {
        tracing::warn!(error = %e, "cannot publish the agent.room.message deliveries; the step comes back");
        return Err(Outcome::Parked(cx.soon()));
    }
    if let Some(sink) = &state.assistant.output_sink {
        if let Err(e) = crate::notify::deliver_output(cx, turn_id, sink, &message).await {
            tracing::warn!(error = %e, "cannot publish the output sink's delivery; the step comes back");
            return Err(Outcome::Parked(cx.soon()));
        }
    }
    if let Some(next) = next {
        wake(cx, envelope, &next, session).await?;
    }
    super::succeed(cx, turn_id, fence, &json!({"message": message})).await?;
    announce(cx, envelope, state).await
}

/// The newest output of each tool configuration the turn called stays with the session for later
/// turns' `$ref`s (written again by a copy finishing the turn: the same values).
async fn remember_tool_outputs(cx: &Cx<'_>, turn_id: &str, state: &TurnState) -> Result<(), Outcome> {
    if !state.tool_calls.iter().any(|c| c.configuration.is_some()) {
        return Ok(());
    }
    let sessions = cx.store.sessions();
    let outcomes = sessions.call_outcomes(turn_id).await.map_err(|_| Outcome::Parked(cx.soon()))?;
    let outputs = crate::overrides::newest_outputs(state, &outcomes);
    sessions.remember_tool_outputs(&state.session_id, &outputs).await.map_err(|_| Outcome::Parked(cx.soon()))
}

/// Drops the oldest whole exchanges of the session's history once it is over its budget (best
/// effort: the next finish trims what this one could not).
async fn trim_history(cx: &Cx<'_>, session: &str, (messages, bytes): (usize, usize)) {
    let (max_messages, max_bytes) = (cx.config.history_max_messages, cx.config.history_max_bytes);
    if messages <= max_messages && bytes <= max_bytes {
        return;
    }
    if let Err(e) = cx.store.sessions().trim_history(session, max_messages, max_bytes).await {
        tracing::debug!(error = %e, "the session's history was not trimmed");
    }
}

/// Steers arrived while the model answered: the turn keeps its session and calls the model again
/// with them (its answer so far stays in the conversation, and joins the history with the rest).
async fn go_on(cx: &Cx<'_>, envelope: &Envelope, state: &TurnState, fence: Fence<'_>) -> Result<Outcome, Outcome> {
    let mut state = state.clone();
    state.final_message = None;
    let step = Job::Turn(TurnJob { session_id: state.session_id.clone(), round: state.round });
    let next = Envelope { gen: envelope.gen, ..Envelope::new(envelope.execution_id.clone(), step, now_ms()) };
    let owed = Owed::Next { envelope: Box::new(next.clone()) };
    let on = Transition::new(ClaimAfter::Release("released")).owe(&owed).turn(&state);
    match cx.store.executions().transition(&envelope.execution_id, fence, cx.config.claim_lease, &on).await {
        Ok(true) => {}
        Ok(false) => return Err(Outcome::Fenced),
        Err(_) => return Err(Outcome::Parked(cx.soon())),
    }
    publish_next(cx, &next).await.map_err(Outcome::from)?;
    retire(cx, envelope, &owed).await;
    Ok(Outcome::Done(Finished::Success))
}

/// A finished turn's answer in the session's message log, then `message_complete` and `done`,
/// sent after its record says `succeeded`.
pub(super) async fn announce(cx: &Cx<'_>, envelope: &Envelope, state: &TurnState) -> Result<Outcome, Outcome> {
    if let Some(done) = state.compaction.as_ref().and_then(|c| c.done.as_ref()) {
        return super::compact::announce(cx, envelope, state, &done.report).await;
    }
    let message = state.final_message.clone().unwrap_or_default();
    let answer = Message::text("assistant", message["content"].as_str().unwrap_or_default());
    let created_at = message["created_at"].as_str().unwrap_or_default();
    let entry = history::answer_entry(&envelope.execution_id, &state.message_id, &answer, created_at);
    // The log entry and both events in one write, in order.
    let session = &state.session_id;
    let now = now_ms();
    let closing = state.agent.as_ref().map(|a| a.closing.clone()).unwrap_or_default();
    let last = [turn::message_complete_event(&message), turn::done_event(&state.message_id)];
    let events: Vec<_> =
        closing.into_iter().chain(last).map(|event| turn::with_base_fields(event, session, now)).collect();
    if let Err(e) = cx.store.sessions().log_and_publish(session, &entry, &events).await {
        tracing::warn!(error = %e, "the answer is not in the session's message log, nor its last events in the stream");
    }
    retire(cx, envelope, &Owed::Announce).await;
    Ok(Outcome::Done(Finished::Success))
}

/// A turn that ends as a dead letter (model failure, too many rounds, delivery limit): the client
/// is told once, no step of it runs again until a replay, its session moves on — and turns that
/// had steered into it run on their own, first in line.
pub(crate) async fn abandon(
    cx: &Cx<'_>,
    envelope: &Envelope,
    job: &TurnJob,
    dead: &DeadLetterRecord,
    code: Option<&'static str>,
) -> Result<(), String> {
    let code = code.unwrap_or(failure_code(dead.reason));
    let error = |message_id: &str| turn::error_event(code, &dead.last_error, None, message_id);
    end_turn(cx, envelope, &job.session_id, error).await.map_err(|_| "cannot end the turn".to_string())
}

/// A turn a client cancelled (`POST /v1/executions/{id}/cancel`), found by its step before the
/// model call: it ends like an abandoned one (error `cancelled`, then `done`; its session moves
/// on), then its record says `cancelled`, and copies of its step are only acked.
pub(super) async fn cancel(step: &ClaimedStep<'_>, _state: &TurnState) -> Outcome {
    tracing::info!("the turn was cancelled; it ends before its model call");
    let error = |message_id: &str| turn::error_event("cancelled", "the turn was cancelled", None, message_id);
    if let Err(stop) = end_turn(&step.cx, step.envelope, &step.job.session_id, error).await {
        return stop;
    }
    let cancelled = Transition::new(ClaimAfter::Release("cancelled")).status(ExecutionStatus::Cancelled);
    match step.write(&cancelled).await {
        Ok(()) => Outcome::Done(Finished::Cancelled),
        Err(stop) => stop,
    }
}

/// A turn whose prompt does not fit its model's window, found before its model call (no budget
/// taken, no request made): the client's input is the problem, so it is no dead letter. The step's
/// claim is checked first (a fenced write naming the error), then the client gets
/// `context_limit_exceeded` and `done`, the session moves on (and stays usable: a compaction or a
/// shorter input runs next), and the record says `failed`, with the error as its result.
pub(super) async fn overflow(step: &ClaimedStep<'_>, over: turn::ContextOverflow) -> Outcome {
    let (limit, tokens) = (over.context_limit, over.actual_tokens);
    tracing::info!(context_limit = limit, actual_tokens = tokens, "the prompt exceeds the model's context window");
    let message = over.message();
    if let Err(stop) = step.write(&Transition::new(ClaimAfter::Keep).last_error(&message)).await {
        return stop;
    }
    let error = |message_id: &str| over.error_event(message_id);
    if let Err(stop) = end_turn(&step.cx, step.envelope, &step.job.session_id, error).await {
        return stop;
    }
    let result = json!({"error": {"code": turn::CONTEXT_LIMIT_EXCEEDED, "message": message,
        "context_limit": limit, "actual_tokens": tokens}});
    let failed = Transition::new(ClaimAfter::Complete(&result)).status(ExecutionStatus::Failed).last_error(&message);
    match step.write(&failed).await {
        Ok(()) => Outcome::Done(Finished::ContextLimit),
        Err(stop) => stop,
    }
}

/// Ends a turn that will not finish: the client gets the `error` event `error` makes (given the
/// turn's message id) and `done` once (the state says it was told), and its session moves on to
/// the next turn in line.
async fn end_turn(
    cx: &Cx<'_>,
    envelope: &Envelope,
    session_id: &str,
    error: impl FnOnce(&str) -> serde_json::Value,
) -> Result<(), Outcome> {
    let turn_id = &envelope.execution_id;
    let state = cx.store.sessions().load_turn(turn_id).await.map_err(|_| Outcome::Parked(cx.soon()))?;
    if let Some(mut state) = state.filter(|s| !s.dead_lettered) {
        emit(cx, session_id, error(&state.message_id)).await;
        emit(cx, session_id, turn::done_event(&state.message_id)).await;
        state.dead_lettered = true;
        cx.store.sessions().save_turn(turn_id, &state).await.map_err(|_| Outcome::Parked(cx.soon()))?;
    }
    let next =
        cx.store.sessions().session_abandon(session_id, turn_id).await.map_err(|_| Outcome::Parked(cx.soon()))?;
    match next {
        Some(next) => wake(cx, envelope, &next, session_id).await,
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
