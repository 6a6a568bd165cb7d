//! A client's `tool_output`: each output answers the client tool call its `event_id` names, once.
//! Its outcome is recorded on the call's turn under the call's key (the first answer wins, as for
//! a callback's result), its `tool_output` event is appended, and the answer that completes the
//! turn's round publishes the turn's next step with a publisher confirm. A request repeated after
//! a failed publish finds its answers recorded and the step still owed, and publishes it.

use std::collections::BTreeSet;

use axum::http::StatusCode;
use serde_json::Value;

use fleet_platform::now_ms;
use fleet_platform::store::RoundState;
use fleet_protocol::agent_session::ClientCall;
use fleet_protocol::envelope::{Envelope, Job, TurnJob};
use fleet_protocol::execution::field;
use fleet_protocol::history;
use fleet_protocol::life::Owed;
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::turn::{self, CallOutcome};

use super::wire::{ToolOutput, ToolOutputRequest};
use super::{bad_request, Started};
use crate::error::ApiError;
use crate::routes::submit::{publish, EnqueueFailure};
use crate::stream::{Awaited, StreamId};
use crate::AppState;

/// Records the outputs and publishes what they complete; the response follows the turns answered.
pub(super) async fn submit(state: &AppState, session: &str, request: &ToolOutputRequest) -> Result<Started, ApiError> {
    request.check().map_err(bad_request)?;
    let calls = named_calls(state, session, request).await?;
    let repeated = already_answered(state, &calls).await?;
    if !repeated.is_empty() && repeated.len() != calls.len() {
        let id = request.tool_outputs[repeated[0]].event_id();
        return Err(answered(id));
    }
    let subscription = state.streams.join(session).await?;
    let mut first_event: Option<StreamId> = None;
    let mut to_publish = Vec::new();
    for (call, outcome) in &calls {
        let report = state.store.sessions().record_call_outcome(&call.turn, &call.key, outcome, call.round + 1).await?;
        if report.first {
            let id = announce(state, session, call, outcome, &report.message_id).await?;
            first_event = first_event.or(StreamId::parse(&id));
        }
        match report.round {
            RoundState::Publish => to_publish.push((call.turn.clone(), call.round + 1, report.gen)),
            RoundState::Elsewhere if report.first => return Err(not_waiting(call)),
            _ => {}
        }
    }
    if !repeated.is_empty() && to_publish.is_empty() {
        return Err(answered(request.tool_outputs[0].event_id()));
    }
    for (turn_id, round, gen) in &to_publish {
        next_step(state, session, turn_id, *round, *gen).await?;
    }
    let after = match first_event {
        Some(id) => id.before(),
        None => StreamId::parse(&state.store.sessions().last_event_id(session).await?).unwrap_or(StreamId::ZERO),
    };
    let turns: BTreeSet<String> = calls.iter().map(|(c, _)| c.turn.clone()).collect();
    let awaited = Awaited { turns: turns.into_iter().collect(), steered_from: None };
    Ok(Started { subscription, after, ends_after: after, awaited })
}

/// The call each output names, with the outcome it reports; an event that names no client tool
/// call of this session is a 400 naming the output.
async fn named_calls(
    state: &AppState,
    session: &str,
    request: &ToolOutputRequest,
) -> Result<Vec<(ClientCall, CallOutcome)>, ApiError> {
    let mut calls = Vec::with_capacity(request.tool_outputs.len());
    for (i, output) in request.tool_outputs.iter().enumerate() {
        let id = output.event_id();
        let Some(call) = state.store.sessions().client_call(session, id).await? else {
            return Err(bad_request(format!(
                "tool_outputs[{i}].event_id {id:?} names no client tool call of this session (see the \
                 client_tool_pending event's pending_calls)"
            )));
        };
        let outcome = match output {
            ToolOutput::Success { output, .. } => {
                CallOutcome { ok: true, result: Value::Object(output.clone()), external: None }
            }
            ToolOutput::Error { error, .. } => CallOutcome { ok: false, result: error.clone(), external: None },
        };
        if outcome.ok {
            check_output(state, &call.tool_name, &outcome.result, i).await?;
        }
        calls.push((call, outcome));
    }
    Ok(calls)
}

/// A success's output must satisfy its tool's `output_schema`, if the tool has one: checked for
/// every output before any is recorded, so a refused request records nothing.
async fn check_output(state: &AppState, tool: &str, output: &Value, i: usize) -> Result<(), ApiError> {
    let Some(schema) = state.store.registry().get_tool(tool).await?.and_then(|t| t.output_schema) else {
        return Ok(());
    };
    let compiled = fleet_protocol::schema::ToolSchema::compile_at(&schema, "output_schema")
        .map_err(|e| bad_request(format!("tool {tool:?} has an output_schema that does not compile: {e}")))?;
    let field = format!("tool_outputs[{i}].output");
    compiled
        .check_at(output, &field)
        .map_err(|e| bad_request(format!("{field} does not match tool {tool:?}'s output_schema: {e}")))
}

/// The places of the outputs whose call already has an outcome.
async fn already_answered(state: &AppState, calls: &[(ClientCall, CallOutcome)]) -> Result<Vec<usize>, ApiError> {
    let mut answered = Vec::new();
    let turns: BTreeSet<&str> = calls.iter().map(|(c, _)| c.turn.as_str()).collect();
    for turn in turns {
        let outcomes = state.store.sessions().call_outcomes(turn).await?;
        for (i, (call, _)) in calls.iter().enumerate() {
            if call.turn == turn && outcomes.contains_key(&call.key) {
                answered.push(i);
            }
        }
    }
    answered.sort_unstable();
    Ok(answered)
}

/// The answer's `tool_output` event (and its place in the session's message log); its id.
async fn announce(
    state: &AppState,
    session: &str,
    call: &ClientCall,
    outcome: &CallOutcome,
    message_id: &str,
) -> Result<String, ApiError> {
    // Whole: the request's body limit bounds it (the worker cuts what the model reads).
    let content = turn::tool_message_content(outcome, usize::MAX);
    let created_at = rfc3339_from_millis(now_ms());
    let entry = history::result_entry(&call.turn, &call.key, &call.call_id, &content, &created_at);
    state.store.sessions().log_message(session, &entry).await?;
    let mut event = if outcome.ok {
        turn::tool_result_event(&call.call_id, &call.tool_name, outcome, message_id)
    } else {
        let error = outcome.result.as_str().map_or_else(|| outcome.result.to_string(), str::to_string);
        turn::error_event("client_tool_error", &error, Some((&call.call_id, &call.tool_name)), message_id)
    };
    if let Some(configuration) = &call.configuration {
        let shown = call.shown_overrides.clone().unwrap_or_default();
        fleet_protocol::agent_session::name_configuration(
            &mut event,
            configuration,
            "resolved_argument_overrides",
            shown,
        );
    }
    let event = turn::with_base_fields(event, session, now_ms());
    Ok(state.store.sessions().publish_event(session, &event).await?)
}

/// Publishes the turn's next step (its round's calls all answered) and marks it published.
async fn next_step(state: &AppState, session: &str, turn_id: &str, round: u32, gen: u32) -> Result<(), ApiError> {
    let job = Job::Turn(TurnJob { session_id: session.to_string(), round });
    let next = Envelope { gen, ..Envelope::new(turn_id.to_string(), job, now_ms()) };
    publish(state, &next).await.map_err(|failure| match failure {
        EnqueueFailure::BeforePublish(e) => e,
        EnqueueFailure::Publish(e) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "broker_unavailable",
            format!("the outputs are recorded but the turn was not resumed ({e}); send the same tool_output again"),
        ),
    })?;
    let published = [(field::NEXT_PUBLISHED, round.to_string())];
    if let Err(e) = state.store.executions().settle_owed(turn_id, &Owed::TurnNext, &published).await {
        tracing::debug!(error = %e, "the turn's next step is out but not marked so");
    }
    Ok(())
}

fn answered(event_id: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "tool_output_already_submitted",
        format!("the client tool call of event {event_id:?} was already answered; an answer is taken once"),
    )
}

fn not_waiting(call: &ClientCall) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::CONFLICT,
        "turn_not_waiting",
        format!("the turn that made this call ({}) is no longer waiting for it (it ended or was cancelled)", call.turn),
    );
    e.execution_id = Some(call.turn.clone());
    e
}

#[cfg(test)]
mod tests {
    #[test]
    fn conflicts_name_the_event_and_the_turn() {
        let e = super::answered("aev_1-0");
        assert_eq!((e.status.as_u16(), e.code), (409, "tool_output_already_submitted"));
        assert!(e.message.contains("aev_1-0"));
        let call = fleet_protocol::agent_session::ClientCall {
            turn: "exec_a".into(),
            key: "r0.0".into(),
            round: 0,
            call_id: "c".into(),
            tool_name: "t".into(),
            configuration: None,
            shown_overrides: None,
        };
        assert_eq!(super::not_waiting(&call).execution_id.as_deref(), Some("exec_a"));
    }
}
