//! A model answer with tool calls: each call is checked (enabled, arguments parse and satisfy the
//! tool's schema, small enough to travel, its tool's circuit not open) and either answered to the model as an error at once or
//! published as a tool-call job; the turn then waits, holding no worker slot. The step is marked
//! done only once every job it owes is confirmed by the broker.

use std::collections::HashMap;

use serde_json::{json, Value};

use fleet_platform::broker::Publisher;
use fleet_platform::now_ms;
use fleet_platform::store::NewExecution;
use fleet_protocol::circuit::TOOL_UNAVAILABLE;
use fleet_protocol::derived_execution_id;
use fleet_protocol::envelope::{Envelope, Job, JobKind, ToolCallJob, TurnJob, TurnParent};
use fleet_protocol::turn::{self, CallOutcome, Completion, Message, PendingCall, ToolCall, TurnState};

use super::super::circuit::unavailable_answer;
use super::super::release_and_park;
use super::{complete_step, continue_turn, emit};
use crate::process::Processor;
use crate::settle::{trace_headers, Held, Outcome};

pub(super) async fn fan_out(
    p: &Processor,
    publisher: &Publisher,
    envelope: &Envelope,
    job: &TurnJob,
    state: &mut TurnState,
    held: &Held,
    completion: Completion,
) -> Outcome {
    let turn_id = &envelope.execution_id;
    state.conversation.push(Message {
        role: "assistant".into(),
        content: (!completion.content.is_empty()).then(|| completion.content.clone()),
        tool_calls: completion.tool_calls.clone(),
        tool_call_id: None,
    });
    let mut pending = Vec::new();
    for call in &completion.tool_calls {
        let parameters = turn::parse_arguments(&call.arguments);
        let shown = parameters.as_ref().unwrap_or(&Value::Null);
        emit(p, &state.session_id, turn::tool_call_event(call, shown, &state.message_id)).await;
        let exec = derived_execution_id(&[turn_id, &job.round.to_string(), &call.id]);
        let planned = PendingCall { call_id: call.id.clone(), tool_name: call.name.clone(), execution_id: Some(exec) };
        let refused = match refusal(p, state, turn_id, job.round, call, &planned, &parameters).await {
            Some((code, error)) => Some((code, json!(error))),
            None => unavailable_answer(p, &call.name).await.map(|answer| (TOOL_UNAVAILABLE, answer)),
        };
        match refused {
            None => pending.push(planned),
            Some((code, result)) => {
                let error = result.as_str().map_or_else(|| result.to_string(), str::to_string);
                let refused = CallOutcome { ok: false, result };
                if p.store.record_call_outcome(turn_id, &call.id, &refused).await.is_err() {
                    return release_and_park(p, held).await;
                }
                emit(p, &state.session_id, turn::error_event(code, &error, Some(&call.id), &state.message_id)).await;
                pending.push(PendingCall { execution_id: None, ..planned });
            }
        }
    }
    state.tool_calls.extend(pending.iter().cloned());
    state.pending = pending;
    state.round += 1;
    match p.store.save_turn_fenced(turn_id, Some(state), held.fence).await {
        Ok(true) => {}
        Ok(false) => return Outcome::Fenced,
        Err(_) => return release_and_park(p, held).await,
    }
    publish_owed(p, publisher, turn_id, state, held, "success").await
}

/// Why a call is answered to the model at once instead of becoming a job, if it is.
async fn refusal(
    p: &Processor,
    state: &TurnState,
    turn_id: &str,
    round: u32,
    call: &ToolCall,
    planned: &PendingCall,
    parameters: &Result<Value, String>,
) -> Option<(&'static str, String)> {
    if !state.enabled(&call.name) {
        return Some(("tool_not_allowed", format!("tool {:?} is not enabled for this assistant", call.name)));
    }
    let arguments = match parameters {
        Err(e) => return Some(("tool_not_allowed", e.clone())),
        Ok(arguments) => arguments,
    };
    if let Some(e) = crate::arguments::schema_problem(&p.store, &call.name, arguments).await {
        return Some(("invalid_arguments", e));
    }
    // Published, it would be poison to every worker and the turn would wait forever.
    let exec = planned.execution_id.as_deref().unwrap_or_default();
    tool_call_envelope(state, turn_id, planned, exec, arguments.clone(), round)
        .check_publishable_size()
        .err()
        .map(|size| ("tool_arguments_too_large", too_large_message(size)))
}

/// A step redelivered after its model call already moved the turn on: whatever the step owed and
/// may not have published (tool calls, the next step) is published again (ids are derived, so
/// nothing runs twice), then the step is done.
pub(super) async fn after_redelivery(
    p: &Processor,
    publisher: &Publisher,
    turn_id: &str,
    state: &TurnState,
    round: u32,
    held: &Held,
) -> Outcome {
    if state.round == round + 1 && state.final_message.is_none() {
        return publish_owed(p, publisher, turn_id, state, held, "duplicate").await;
    }
    if state.round == round + 1 {
        return super::finish::after_redelivery(p, publisher, turn_id, state, held).await;
    }
    complete_step(p, held, "duplicate").await
}

/// Publishes the round's tool calls that have no outcome yet, and the next step if none is owed.
async fn publish_owed(
    p: &Processor,
    publisher: &Publisher,
    turn_id: &str,
    state: &TurnState,
    held: &Held,
    label: &'static str,
) -> Outcome {
    let Ok(done) = p.store.call_outcomes(turn_id).await else { return release_and_park(p, held).await };
    let arguments = call_arguments(state);
    for call in state.pending.iter().filter(|c| !done.contains_key(&c.call_id)) {
        let Some(exec) = &call.execution_id else { continue };
        let parameters = arguments.get(&call.call_id).cloned().unwrap_or_else(|| json!({}));
        let envelope = tool_call_envelope(state, turn_id, call, exec, parameters, state.round - 1);
        if let Err(e) = publish_call(p, publisher, state, call, &envelope).await {
            tracing::warn!(error = %e, "cannot publish a tool call; the step comes back to publish it");
            return release_and_park(p, held).await;
        }
    }
    let owed = state.pending.iter().any(|c| c.execution_id.is_some() && !done.contains_key(&c.call_id));
    if !owed && continue_turn(p, publisher, turn_id, state).await.is_err() {
        return release_and_park(p, held).await;
    }
    complete_step(p, held, label).await
}

async fn publish_call(
    p: &Processor,
    publisher: &Publisher,
    state: &TurnState,
    call: &PendingCall,
    envelope: &Envelope,
) -> Result<(), String> {
    let _ = p
        .store
        .create_execution(&NewExecution {
            execution_id: &envelope.execution_id,
            kind: JobKind::ToolCall.as_str(),
            tool_name: Some(&call.tool_name),
            room_id: Some(&state.session_id),
            assistant_id: Some(&state.assistant.id),
            now_ms: now_ms(),
            run_at_ms: None,
        })
        .await;
    publisher.publish_job(&p.config.common.topology, envelope, trace_headers()).await.map_err(|e| e.to_string())?;
    p.metrics.jobs_published.with_label_values(&[JobKind::ToolCall.as_str()]).inc();
    Ok(())
}

/// The arguments of the round's calls, from the assistant message that made them.
fn call_arguments(state: &TurnState) -> HashMap<String, Value> {
    let made = state.conversation.iter().rev().find(|m| !m.tool_calls.is_empty());
    made.map(|m| {
        m.tool_calls
            .iter()
            .filter_map(|c| turn::parse_arguments(&c.arguments).ok().map(|a| (c.id.clone(), a)))
            .collect()
    })
    .unwrap_or_default()
}

/// The job that runs `call` (made in the turn's `round`) as execution `exec`.
fn tool_call_envelope(
    state: &TurnState,
    turn_id: &str,
    call: &PendingCall,
    exec: &str,
    parameters: Value,
    round: u32,
) -> Envelope {
    let job = Job::ToolCall(ToolCallJob {
        tool_name: call.tool_name.clone(),
        parameters,
        room_id: Some(state.session_id.clone()),
        assistant_id: Some(state.assistant.id.clone()),
        parent: Some(TurnParent { turn_execution_id: turn_id.to_string(), call_id: call.call_id.clone(), round }),
    });
    Envelope::new(exec.to_string(), job, now_ms())
}

/// What the model is told about a call whose job would be `size` bytes (its arguments are not echoed).
fn too_large_message(size: usize) -> String {
    use fleet_protocol::envelope::{ENVELOPE_HEADROOM_BYTES, MAX_ENVELOPE_BYTES};
    format!(
        "the call's arguments make a job of {size} bytes, over the limit of {} bytes; call the tool with smaller arguments",
        MAX_ENVELOPE_BYTES - ENVELOPE_HEADROOM_BYTES
    )
}
