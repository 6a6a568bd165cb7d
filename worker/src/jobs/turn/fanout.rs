//! A model answer with tool calls: each call is checked (enabled, arguments parse and satisfy the
//! tool's schema, small enough to travel, its tool's circuit not open) and either answered to the
//! model as an error at once or becomes a tool-call job; the turn then waits, holding no worker
//! slot. Calls are keyed by their round and place (never by the model's id, which models reuse
//! and some omit), their publish is owed by the same write that saves the round, and the round's
//! jobs go out with one confirm wait.

use serde_json::{json, Value};

use fleet_platform::broker::Outgoing;
use fleet_platform::now_ms;
use fleet_platform::store::{ClaimAfter, NewExecution, Transition};
use fleet_protocol::agent_config::TRANSITION_TOOL;
use fleet_protocol::agent_session::{self, ClientCall, PendingClientCall};
use fleet_protocol::circuit::TOOL_UNAVAILABLE;
use fleet_protocol::derived_execution_id;
use fleet_protocol::envelope::{Envelope, Job, JobKind, ToolCallJob, TurnJob, TurnParent};
use fleet_protocol::execution::{field, AttemptRecord};
use fleet_protocol::history;
use fleet_protocol::life::Owed;
use fleet_protocol::schedule::first_destination;
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::tools::ToolExecution;
use fleet_protocol::turn::{self, call_key, CallOutcome, Completion, Message, PendingCall, ToolCall, TurnState};

use super::{emit, ClaimedStep};
use crate::context::Cx;
use crate::jobs::circuit::unavailable_answer;
use crate::jobs::stream::emit_id;
use crate::outcome::{Finished, Outcome};
use crate::overrides::{self, Secrets};
use crate::publish::{publish_holding, retire, trace_headers};

pub(super) async fn fan_out(
    step: &ClaimedStep<'_>,
    state: &mut TurnState,
    mut completion: Completion,
    record: AttemptRecord,
) -> Outcome {
    let cx = &step.cx;
    let round = step.job.round;
    completion.name_calls(round);
    if let Some(limit) = transitions_exhausted(state, &completion) {
        // The handoff would pass the agent's limit: the turn ends here, saying so.
        completion.tool_calls.clear();
        return super::finish::finish_beyond_transitions(step, state, completion, record, limit).await;
    }
    state.conversation.push(Message {
        role: "assistant".into(),
        content: (!completion.content.is_empty()).then(|| completion.content.clone()),
        tool_calls: completion.tool_calls.clone(),
        tool_call_id: None,
        images: vec![],
        reasoning: super::finish::replayed_reasoning(state, &completion),
    });
    let mut pending = Vec::new();
    for (position, call) in completion.tool_calls.iter().enumerate() {
        if super::images::is_load(state, call) {
            match super::images::load(step, state, round, position as u32, call).await {
                Ok(planned) => pending.push(planned),
                Err(stop) => return stop,
            }
            continue;
        }
        if call.name == TRANSITION_TOOL && state.agent.is_some() {
            match hand_off(step, state, round, position as u32, call).await {
                Ok(planned) => pending.push(planned),
                Err(stop) => return stop,
            }
            continue;
        }
        match plan(step, state, round, position as u32, call).await {
            Ok(planned) => pending.push(planned),
            Err(stop) => return stop,
        }
    }
    let waits = pending.iter().any(|c| c.execution_id.is_some() || c.client_event.is_some());
    let owed = if waits { Owed::TurnCalls } else { Owed::TurnNext };
    let keys: Vec<&str> = pending.iter().map(|c| c.key.as_str()).collect();
    let keys = keys.join(",");
    state.tool_calls.extend(pending.iter().cloned());
    state.pending = pending;
    state.round += 1;
    state.streaming = None;
    let saved = Transition::new(ClaimAfter::Release("released"))
        .step(step.envelope.step().next_round())
        .owe(&owed)
        .attempt(&record)
        .turn(state)
        .field(field::PENDING, keys)
        .field(field::MESSAGE_ID, &state.message_id);
    if let Err(stop) = step.write(&saved).await {
        return stop;
    }
    log_answer(cx, step.turn_id(), state).await;
    let published = match owed {
        Owed::TurnCalls => publish_owed(cx, step.envelope, state).await,
        _ => publish_next_step(cx, step.envelope, state).await,
    };
    published.unwrap_or_else(|stop| stop)
}

/// The agent's transition limit, if this answer asks for a handoff beyond it.
fn transitions_exhausted(state: &TurnState, completion: &Completion) -> Option<u32> {
    let agent = state.agent.as_ref()?;
    let handoffs = completion.tool_calls.iter().filter(|c| c.name == TRANSITION_TOOL).count() as u32;
    let limit = agent.config.transitions_allowed();
    (handoffs > 0 && agent.transitions + handoffs > limit).then_some(limit)
}

/// A call of the transition tool: answered at once. Allowed, the turn enters the step (its
/// system prompt and tools are the step's from the next model call on, saved with the round) and
/// the client gets `step_transition` with the handoff message; refused, the model is told why.
async fn hand_off(
    step: &ClaimedStep<'_>,
    state: &mut TurnState,
    round: u32,
    position: u32,
    call: &ToolCall,
) -> Result<PendingCall, Outcome> {
    let cx = &step.cx;
    let key = call_key(round, position);
    let arguments = turn::parse_arguments(&call.arguments).unwrap_or_default();
    let to = arguments["step_name"].as_str().unwrap_or_default().to_string();
    let handoff = arguments["handoff_message"].as_str().unwrap_or_default().to_string();
    let from = state.step().unwrap_or_default().to_string();
    let agent = state.agent.as_mut().expect("only an agent's turn hands off");
    let outcome = match agent.config.check_transition(Some(&from), &to) {
        Ok(()) => {
            agent.step = Some(to.clone());
            agent.transitions += 1;
            CallOutcome { ok: true, result: json!({"step": to}), external: None }
        }
        Err(refused) => CallOutcome { ok: false, result: json!(refused), external: None },
    };
    step.answer_now(&key, round, &outcome).await?;
    if outcome.ok {
        state.tell_step();
        let event = agent_session::step_transition_event(&from, &to, &handoff, &state.message_id);
        emit(cx, &state.session_id, event).await;
    }
    Ok(PendingCall::answered(call, key))
}

/// The answer that made the calls joins the session's message log, as it is made (once: its id is
/// the model call's own).
async fn log_answer(cx: &Cx<'_>, turn_id: &str, state: &TurnState) {
    let Some(made) = state.conversation.iter().rev().find(|m| !m.tool_calls.is_empty()) else { return };
    let entry = history::answer_entry(turn_id, &state.message_id, made, &rfc3339_from_millis(now_ms()));
    if let Err(e) = cx.store.sessions().log_message(&state.session_id, &entry).await {
        tracing::warn!(error = %e, "the answer is not in the session's message log");
    }
}

/// One call of the answer: planned as a job, left to the client (a client-executed tool: its
/// `tool_input` event's id is what the client's answer names), or answered to the model at once
/// (its outcome recorded, an `error` event sent). The call's execution id derives from the turn,
/// its generation, round and place, so a fan-out run twice plans the same jobs.
async fn plan(
    step: &ClaimedStep<'_>,
    state: &TurnState,
    round: u32,
    position: u32,
    call: &ToolCall,
) -> Result<PendingCall, Outcome> {
    let cx = &step.cx;
    let turn_id = step.turn_id();
    // A seed 001 agent's model calls a tool configuration by its name; the job runs its tool.
    let configured = state.agent.as_ref().and_then(|a| a.config.tool_configurations.get_key_value(&call.name));
    // An MCP tool is offered to the model as `server__tool`: the call names its fleet tool again.
    let offered = fleet_protocol::tools::fleet_tool_for(&call.name, &state.assistant.enabled_tools).to_string();
    let tool_name = configured.map_or(&offered, |(_, c)| &c.tool_name);
    let parameters = turn::parse_arguments(&call.arguments);
    let shown = parameters.as_ref().unwrap_or(&Value::Null);
    let mut event = turn::tool_call_event(call, shown, &state.message_id);
    // Announced under the fleet tool's name, as its result is (not `server__tool`, the model's).
    event["tool_call"]["tool_name"] = json!(tool_name);
    if let Some((name, c)) = configured {
        agent_session::name_configuration(&mut event, name, "argument_override_paths", json!(c.override_paths()));
    }
    let event = emit_id(cx, &state.session_id, event).await;
    let key = call_key(round, position);
    let gen = step.envelope.gen.to_string();
    let exec = derived_execution_id(&[turn_id, &gen, &key]);
    let client = matches!(cx.tool(tool_name).await, Ok(Some(t)) if t.stored.execution == ToolExecution::Client);
    let planned = PendingCall {
        call_id: call.id.clone(),
        tool_name: tool_name.clone(),
        execution_id: (!client).then(|| exec.clone()),
        key: key.clone(),
        client_event: None,
        configuration: configured.map(|(name, _)| name.clone()),
        approval: None,
    };
    let refused = match refusal(cx, state, turn_id, round, &planned, &parameters).await {
        Some((code, error)) => Some((code, json!(error))),
        None if client => None,
        None => unavailable_answer(cx, tool_name).await.map(|answer| (TOOL_UNAVAILABLE, answer)),
    };
    let Some((code, result)) = refused else {
        // A call that waits for an operator has a job, published to wait for the decision (a client
        // call's job hands it to the client once approved).
        let approval = crate::jobs::approval::policy(cx, tool_name, configured.map(|(_, c)| c)).await;
        if !client {
            return Ok(PendingCall { approval, ..planned });
        }
        // The client can only answer a call whose event it saw: without it, the step runs again.
        let Some(event) = event else { return Err(step.release_and_park().await) };
        let execution_id = approval.as_ref().map(|_| exec);
        let client_event = Some(agent_session::event_id(&event));
        return Ok(PendingCall { client_event, execution_id, approval, ..planned });
    };
    let error = result.as_str().map_or_else(|| result.to_string(), str::to_string);
    let refused = CallOutcome { ok: false, result, external: None };
    step.answer_now(&key, round, &refused).await?;
    let mut event = turn::error_event(code, &error, Some((&call.id, tool_name)), &state.message_id);
    if let Some(name) = &planned.configuration {
        agent_session::name_configuration(&mut event, name, "tool_configuration_name", json!(name));
    }
    emit(cx, &state.session_id, event).await;
    Ok(PendingCall { execution_id: None, ..planned })
}

/// Why a call is answered to the model at once instead of becoming a job, if it is. A tool
/// configuration's call is checked with its overrides laid over the model's arguments (one that
/// cannot be resolved short-circuits the call).
async fn refusal(
    cx: &Cx<'_>,
    state: &TurnState,
    turn_id: &str,
    round: u32,
    planned: &PendingCall,
    parameters: &Result<Value, String>,
) -> Option<(&'static str, String)> {
    if planned.configuration.is_none() && !state.enabled(&planned.tool_name) {
        return Some(("tool_not_allowed", format!("tool {:?} is not enabled for this assistant", planned.tool_name)));
    }
    let arguments = match parameters {
        Err(e) => return Some(("tool_not_allowed", e.clone())),
        Ok(arguments) => arguments,
    };
    let checked = match &planned.configuration {
        Some(name) => {
            let secrets = Secrets::Opened(&cx.config.secrets_key);
            match overrides::resolve(cx.store, secrets, state, turn_id, name).await {
                Ok(resolved) => resolved.apply(arguments),
                Err(e) => return Some(("unresolved_argument_override", e)),
            }
        }
        None => arguments.clone(),
    };
    if let Some(e) = crate::arguments::schema_problem(cx, &planned.tool_name, &checked).await {
        return Some(("invalid_arguments", e));
    }
    // A client tool's call is not published.
    planned.execution_id.as_ref()?;
    // Published, it would be poison to every worker and the turn would wait forever.
    tool_call_envelope(state, turn_id, planned, arguments.clone(), round)
        .check_publishable_size()
        .err()
        .map(|size| ("tool_arguments_too_large", too_large_message(size)))
}

/// Publishes the round's calls that have no outcome yet (each record created if absent), with one
/// confirm wait, and tells the client which calls it owes (a client-executed tool's), then retires
/// what the turn owed. Run by the fan-out, or by a copy of its step after a worker died between
/// the save and the publish.
pub(super) async fn publish_owed(cx: &Cx<'_>, cause: &Envelope, state: &TurnState) -> Result<Outcome, Outcome> {
    let turn_id = &cause.execution_id;
    let done = cx.store.sessions().call_outcomes(turn_id).await.map_err(|_| Outcome::Parked(cx.soon()))?;
    let arguments = round_arguments(state);
    let mut messages = Vec::new();
    let mut client = Vec::new();
    let mut handed = None;
    for (call, args) in state.pending.iter().zip(arguments) {
        if done.contains_key(call.outcome_key()) {
            continue;
        }
        if let Some(event_id) = &call.client_event {
            let (arguments, shown) = client_arguments(cx, state, turn_id, call, args.clone()).await;
            let pending = PendingClientCall {
                event_id: event_id.clone(),
                tool_name: call.tool_name.clone(),
                configuration: call.configuration.clone(),
                arguments,
            };
            if call.approval.is_none() {
                client.push((call, pending, shown));
                continue;
            }
            // Told to the client only once approved: kept with the approval until then.
            handed = Some(client_release(turn_id, state, call, &pending, shown));
        }
        let Some(exec) = &call.execution_id else { continue };
        let mut envelope = tool_call_envelope(state, turn_id, call, args.clone(), state.round - 1);
        create_record(cx, state, call, exec).await?;
        if let Some(policy) = &call.approval {
            let held = crate::jobs::approval::HeldForApproval { policy, parameters: &args, client: handed.take() };
            envelope = crate::jobs::approval::hold(cx, state, turn_id, call, held, envelope).await?;
        }
        // Due now, to its work queue; one waiting for its approval, to the delay queue that holds it.
        let common = &cx.config.common;
        let (exchange, routing_key) = first_destination(&common.topology, &common.retry, &envelope, now_ms());
        messages.push(Outgoing::job(exchange, routing_key, &envelope, trace_headers()));
    }
    // All or nothing: a call that went out and is sent again is a copy, acked by its claim.
    let all = || async { cx.publisher.publish_many(&messages).await.into_iter().collect::<Result<Vec<()>, _>>() };
    publish_holding(cx, cause, || async { all().await.map(|_| ()) }).await?;
    cx.metrics.jobs_published.with_label_values(&[JobKind::ToolCall.as_str()]).inc_by(messages.len() as u64);
    announce_client_calls(cx, turn_id, state, &client).await?;
    retire(cx, cause, &Owed::TurnCalls).await;
    Ok(Outcome::Done(Finished::Success))
}

/// A client call's arguments: a tool configuration's overrides resolved now and laid over the
/// model's (secrets sealed for the session, opened only as the client is shown them), and the
/// overrides as events show them. Overrides that no longer resolve leave the model's arguments.
async fn client_arguments(
    cx: &Cx<'_>,
    state: &TurnState,
    turn_id: &str,
    call: &PendingCall,
    args: Value,
) -> (Value, Option<Value>) {
    let Some(configuration) = &call.configuration else { return (args, None) };
    let secrets = Secrets::Opened(&cx.config.secrets_key);
    match overrides::resolve(cx.store, secrets, state, turn_id, configuration).await {
        Ok(resolved) => {
            let owner = agent_session::client_call_owner(&state.session_id);
            let seal = |plain: &str| cx.config.secrets_key.encrypt(&owner, plain);
            (resolved.apply_sealed(&args, &seal), Some(Value::Object(resolved.shown)))
        }
        Err(e) => {
            tracing::warn!(error = %e, "a client call's overrides no longer resolve; it gets the model's arguments");
            (args, None)
        }
    }
}

/// What hands an approved client call to its client: the call its `tool_output` is checked
/// against, and the `client_tool_pending` event (JSON, kept with the approval).
fn client_release(
    turn_id: &str,
    state: &TurnState,
    call: &PendingCall,
    pending: &PendingClientCall,
    shown: Option<Value>,
) -> String {
    let named = ClientCall {
        turn: turn_id.to_string(),
        key: call.key.clone(),
        round: state.round - 1,
        call_id: call.call_id.clone(),
        tool_name: call.tool_name.clone(),
        configuration: call.configuration.clone(),
        shown_overrides: shown,
    };
    let event = agent_session::client_tool_pending_event(std::slice::from_ref(pending), &state.message_id);
    json!({"event_id": pending.event_id, "call": named, "event": event}).to_string()
}

/// Records which turn's call each client event names (what the client's `tool_output` is checked
/// against), then sends the `client_tool_pending` event: the client learns of a call only once its
/// answer can be taken.
async fn announce_client_calls(
    cx: &Cx<'_>,
    turn_id: &str,
    state: &TurnState,
    calls: &[(&PendingCall, PendingClientCall, Option<Value>)],
) -> Result<(), Outcome> {
    if calls.is_empty() {
        return Ok(());
    }
    let made_in = state.round - 1;
    let refs: Vec<(String, ClientCall)> = calls
        .iter()
        .map(|(call, pending, shown)| {
            let named = ClientCall {
                turn: turn_id.to_string(),
                key: call.key.clone(),
                round: made_in,
                call_id: call.call_id.clone(),
                tool_name: call.tool_name.clone(),
                configuration: call.configuration.clone(),
                shown_overrides: shown.clone(),
            };
            (pending.event_id.clone(), named)
        })
        .collect();
    cx.store.sessions().put_client_calls(&state.session_id, &refs).await.map_err(|_| Outcome::Parked(cx.soon()))?;
    let pending: Vec<PendingClientCall> = calls.iter().map(|(_, p, _)| p.clone()).collect();
    emit(cx, &state.session_id, agent_session::client_tool_pending_event(&pending, &state.message_id)).await;
    Ok(())
}

async fn create_record(cx: &Cx<'_>, state: &TurnState, call: &PendingCall, exec: &str) -> Result<(), Outcome> {
    let record = NewExecution {
        execution_id: exec,
        kind: JobKind::ToolCall,
        tool_name: Some(&call.tool_name),
        room_id: Some(&state.session_id),
        assistant_id: Some(&state.assistant.id),
        tenant: state.tenant.as_deref(),
        now_ms: now_ms(),
        run_at_ms: None,
    };
    cx.store.executions().create_execution(&record, None).await.map(|_| ()).map_err(|_| Outcome::Parked(cx.soon()))
}

/// Publishes the turn's next step for a round whose calls all ended (or were all answered at
/// once), then retires what the turn owed.
pub(super) async fn publish_next_step(cx: &Cx<'_>, cause: &Envelope, state: &TurnState) -> Result<Outcome, Outcome> {
    let step = Job::Turn(TurnJob { session_id: state.session_id.clone(), round: state.round });
    let next = Envelope { gen: cause.gen, ..Envelope::new(cause.execution_id.clone(), step, now_ms()) };
    let topology = &cx.config.common.topology;
    publish_holding(cx, cause, || cx.publisher.publish_job(topology, &next, trace_headers())).await?;
    let published = [(field::NEXT_PUBLISHED, state.round.to_string())];
    if let Err(e) = cx.store.executions().settle_owed(&cause.execution_id, &Owed::TurnNext, &published).await {
        tracing::debug!(error = %e, "the turn's next step is out but not marked so");
    }
    Ok(Outcome::Done(Finished::Success))
}

/// The arguments of the round's calls, by place, from the assistant message that made them.
fn round_arguments(state: &TurnState) -> Vec<Value> {
    let made = state.conversation.iter().rev().find(|m| !m.tool_calls.is_empty());
    let calls = made.map(|m| m.tool_calls.as_slice()).unwrap_or_default();
    state
        .pending
        .iter()
        .enumerate()
        .map(|(i, _)| calls.get(i).and_then(|c| turn::parse_arguments(&c.arguments).ok()).unwrap_or_else(|| json!({})))
        .collect()
}

/// The job that runs `call` (made in the turn's `round`).
fn tool_call_envelope(state: &TurnState, turn_id: &str, call: &PendingCall, parameters: Value, round: u32) -> Envelope {
    let position = call.key.rsplit('.').next().and_then(|p| p.parse().ok());
    let job = Job::ToolCall(ToolCallJob {
        tool_name: call.tool_name.clone(),
        parameters,
        room_id: Some(state.session_id.clone()),
        assistant_id: Some(state.assistant.id.clone()),
        parent: Some(TurnParent {
            turn_execution_id: turn_id.to_string(),
            call_id: call.call_id.clone(),
            round,
            position,
            configuration: call.configuration.clone(),
            approval: None,
        }),
    });
    Envelope::new(call.execution_id.clone().unwrap_or_default(), job, now_ms())
}

/// What the model is told about a call whose job would be `size` bytes (its arguments are not echoed).
fn too_large_message(size: usize) -> String {
    use fleet_protocol::envelope::{ENVELOPE_HEADROOM_BYTES, MAX_ENVELOPE_BYTES};
    format!(
        "the call's arguments make a job of {size} bytes, over the limit of {} bytes; call the tool with smaller arguments",
        MAX_ENVELOPE_BYTES - ENVELOPE_HEADROOM_BYTES
    )
}
