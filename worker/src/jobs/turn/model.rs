//! One model call of a turn: the request (instructions, history, conversation, enabled tools),
//! tokens streamed to the session under the call's own message id, the claim renewed throughout
//! (a model may think longer than the lease, and a lost lease drops the call), and the attempt
//! kept for the step's next write, like a callback attempt.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tracing::Instrument;

use fleet_platform::now_ms;
use fleet_protocol::budget::estimate_tokens;
use fleet_protocol::execution::{AttemptOutcome, AttemptRecord};
use fleet_protocol::sanitize::sanitize_error;
use fleet_protocol::tenant::Call as UsageCall;
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::turn::{self, Completion, Message, TurnState};

use super::budget::{self, BudgetReservation};
use super::images::{self, Shown};
use super::{emit, ClaimedStep};
use crate::context::Cx;
use crate::jobs::claim::renewing;
use crate::jobs::stream::batched;
use crate::llm::{ChatRequest, LlmClient, LlmError};
use crate::outcome::{Failure, Outcome};

/// What a model call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    /// The turn's answer: the enabled tools offered, tokens streamed to the session.
    Answer,
    /// A compaction's summary: no tools, nothing streamed (it is not a message of the conversation).
    Summary,
}

/// Takes the call's estimate from its provider's budget, or parks the step until its slot;
/// `ahead` is the provider's answer when it was asked beside the session's take.
pub(super) async fn reserve(
    step: &ClaimedStep<'_>,
    state: &TurnState,
    purpose: Purpose,
    ahead: Option<budget::Ahead>,
) -> Result<BudgetReservation, Outcome> {
    let (provider, model, max_tokens) = step.target(state);
    let messages: Vec<Value> = state.conversation.iter().map(Message::to_openai).collect();
    let tools = if purpose == Purpose::Answer { tool_specs(step, state).await } else { vec![] };
    budget::admit(step, state, &provider, &model, estimate_tokens(&messages, &tools, max_tokens), ahead).await
}

/// Whether the turn's answer call would overflow its model's context window (the assistant's, else
/// the fleet's for the model; neither known: never). Estimated from what the call would send.
pub(super) async fn overflow(step: &ClaimedStep<'_>, state: &TurnState) -> Option<turn::ContextOverflow> {
    let (_, model, _) = step.target(state);
    let fleet = &step.cx.config.llm_context_windows;
    let window = turn::context_window(state.assistant.model_config.context_window, fleet, &model)?;
    let messages: Vec<Value> = state.conversation.iter().map(Message::to_openai).collect();
    let tools = tool_specs(step, state).await;
    turn::check_context(turn::estimate_prompt_tokens(&messages, &tools), Some(window))
}

/// The model call, its tokens streamed under the call's message id once `gate` answers `true` (the
/// call's state is saved; `false`: nothing streams). `Ok` carries the attempt for the history,
/// written with the step's next transition; `add_usage` puts its tokens in the state.
pub(super) async fn call(
    step: &ClaimedStep<'_>,
    state: &TurnState,
    purpose: Purpose,
    reserved: BudgetReservation,
    shown: &Shown,
    gate: impl std::future::Future<Output = bool>,
) -> Result<(Completion, AttemptRecord), Outcome> {
    let cx = &step.cx;
    let config = &state.assistant.model_config;
    let (_, model, max_tokens) = step.target(state);
    let request = ChatRequest {
        model: &model,
        temperature: Some(config.temperature.unwrap_or(turn::DEFAULT_TEMPERATURE)),
        max_tokens,
        messages: shown.messages(&state.conversation),
        tools: if purpose == Purpose::Answer { tool_specs(step, state).await } else { vec![] },
        response_format: if purpose == Purpose::Answer { response_format(state) } else { None },
    };
    let (message_id, session) = (state.message_id.clone(), state.session_id.clone());
    let label = model_label(cx, &model);
    let span =
        tracing::info_span!("llm", otel.name = "chat.completions", otel.kind = "client", gen_ai.request.model = %label);
    let traceparent = fleet_platform::telemetry::http_headers(&span);
    let started_ms = now_ms();
    let clock = Instant::now();
    let index = AtomicU64::new(0);
    // Tokens are handed to a writer that runs beside the call: the call never waits for Redis per
    // token, and a run of tokens that arrived during one write goes out as the next.
    let (tokens, writer) = batched(cx, &session);
    let writer = async {
        if gate.await {
            writer.await;
        }
    };
    let (counter, message_id) = (&index, &message_id);
    let on_token = move |token: String| {
        let n = counter.fetch_add(1, Ordering::Relaxed);
        if purpose == Purpose::Answer {
            tokens.send(turn::token_event(&token, n, message_id));
        }
        std::future::ready(())
    };
    let fallback_id = format!("{}:{}:fallback:{}", step.turn_id(), step.envelope.gen, step.envelope.attempt);
    // Pinned where it is made and lent to what awaits it: a future passed on by value is laid out
    // again in every future it passes through (the compiler does not overlap the two), and the
    // model call is the largest part of a turn step.
    let streamed =
        std::pin::pin!(complete_with_fallback(cx, &reserved, &fallback_id, request, traceparent, &index, on_token));
    // The call's closure (and the sender in it) is dropped when the call ends: the writer then
    // writes what is left and ends, before any later event of the step. The call's usage is
    // counted meanwhile.
    let usage_of = usage_call(state);
    let counted = async {
        let result = streamed.await;
        if let Ok(c) = &result {
            budget::count_usage(cx, usage_of, c.prompt_tokens.unwrap_or(0), c.completion_tokens.unwrap_or(0)).await;
        }
        result
    };
    let streamed = std::pin::pin!(async { tokio::join!(counted, writer).0 }.instrument(span));
    let Some(result) = renewing(cx, step.turn_id(), step.held, true, streamed).await else {
        return Err(Outcome::Fenced);
    };
    let elapsed = clock.elapsed();
    cx.metrics.llm_request_duration.with_label_values(&[label]).observe(elapsed.as_secs_f64());
    log_model_attempt(step.envelope.attempt, elapsed, &result);
    let record = attempt_record(step.envelope.attempt, started_ms, elapsed, &result);
    finish(step, state, label, started_ms, record, result)
}

/// The call's end: a failure as the step's outcome (retryable or not, when to retry), a success
/// as its attempt, with its tokens counted by model and tenant. A stage's result like any other
/// (the async stages return the same `Outcome`, which this one only moves once per model call).
#[allow(clippy::result_large_err)]
fn finish(
    step: &ClaimedStep<'_>,
    state: &TurnState,
    label: &str,
    started_ms: i64,
    mut record: AttemptRecord,
    result: Result<Completion, LlmError>,
) -> Result<(Completion, AttemptRecord), Outcome> {
    let cx = &step.cx;
    let completion = match result {
        Ok(completion) => completion,
        Err(e) => {
            let (retry_after, permanent) = match &e {
                LlmError::Retryable { retry_after, .. } => (*retry_after, false),
                LlmError::Permanent { .. } => (None, true),
            };
            let error = e.message().to_string();
            let held = step.held;
            return Err(Outcome::Failed(Failure { record, error, retry_after, permanent, held, started_ms }));
        }
    };
    let tenant = fleet_protocol::tenant::metric_label(&cx.config.metric_tenants, state.tenant.as_deref());
    for (kind, n) in [("prompt", completion.prompt_tokens), ("completion", completion.completion_tokens)] {
        if let Some(n) = n {
            cx.metrics.llm_tokens.with_label_values(&[label, kind]).inc_by(n);
            cx.metrics.llm_tenant_tokens.with_label_values(&[tenant, kind]).inc_by(n);
        }
    }
    record.outcome = AttemptOutcome::Success;
    Ok((completion, record))
}

/// Adds a call's tokens to the turn's usage.
pub(super) fn add_usage(state: &mut TurnState, completion: &Completion) {
    state.usage.prompt_tokens += completion.prompt_tokens.unwrap_or(0);
    state.usage.completion_tokens += completion.completion_tokens.unwrap_or(0);
}

/// A reasoning model's thinking, once its call has ended: one event under the call's message id,
/// before the answer's or the tool calls' events. Only shown: the conversation, the history and
/// later prompts never hold it (a model is sent its answers, not its thoughts).
pub(super) async fn show_reasoning(cx: &Cx<'_>, state: &TurnState, completion: &Completion) {
    if !completion.reasoning.is_empty() {
        emit(cx, &state.session_id, turn::reasoning_event(&completion.reasoning, &state.message_id)).await;
    }
}

/// Whose usage a call of the turn is: its tenant's, assistant's and session's (none without a
/// tenant).
fn usage_call(state: &TurnState) -> Option<UsageCall<'_>> {
    state.tenant.as_deref().map(|tenant| UsageCall {
        tenant,
        assistant: &state.assistant.id,
        session: &state.session_id,
    })
}

/// The `model` label: a model the fleet is configured with, else `other` (a client may name any
/// model, and a label per name would be a series per name).
fn model_label<'a>(cx: &'a Cx<'_>, model: &'a str) -> &'a str {
    if cx.config.llm_models.iter().any(|m| m == model) {
        model
    } else {
        "other"
    }
}

/// Calls the turn's provider; after a retryable failure before any token streamed (`streamed`
/// still 0), its fallback provider once, within the same attempt and under the same message id,
/// if the fallback's budget has room now.
async fn complete_with_fallback<F, Fut>(
    cx: &Cx<'_>,
    reserved: &BudgetReservation,
    fallback_id: &str,
    request: ChatRequest<'_>,
    traceparent: Vec<(String, String)>,
    streamed: &AtomicU64,
    on_token: F,
) -> Result<Completion, LlmError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (name, client) = cx.llm.get(Some(&reserved.provider))?;
    let fallback = cx.llm.fallback_of(name).map(|f| (f, request.clone(), traceparent.clone()));
    let model = request.model;
    let first = spend(cx, client, reserved, request, traceparent, &on_token).await;
    let Some((fallback, request, traceparent)) = fallback else { return first };
    match first {
        Err(LlmError::Retryable { message, .. }) if streamed.load(Ordering::Relaxed) == 0 => {
            let Some(room) = budget::try_now(cx, reserved, fallback_id, fallback, model).await else {
                tracing::warn!(provider = name, fallback, error = %message, "model provider failed; its fallback has no budget left now");
                return Err(LlmError::Retryable { status: None, retry_after: None, message });
            };
            tracing::warn!(provider = name, fallback, error = %message, "model provider failed; trying its fallback");
            let (_, client) = cx.llm.get(Some(fallback))?;
            spend(cx, client, &room, request, traceparent, &on_token).await
        }
        other => other,
    }
}

/// One provider's call, settled with its budget: the tokens it used, or its 429's pause (which the
/// step's retry then waits out at least).
async fn spend<F, Fut>(
    cx: &Cx<'_>,
    client: &LlmClient,
    reserved: &BudgetReservation,
    request: ChatRequest<'_>,
    traceparent: Vec<(String, String)>,
    on_token: &F,
) -> Result<Completion, LlmError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (result, limits) = client.complete(request, traceparent, on_token).await;
    match result {
        Ok(completion) => {
            let used = completion.prompt_tokens.zip(completion.completion_tokens).map(|(p, c)| p + c);
            budget::settle(cx, reserved, used, &limits).await;
            Ok(completion)
        }
        Err(LlmError::Retryable { status: Some(429), retry_after, message }) => {
            let pause = budget::rate_limited(cx, reserved, retry_after, &limits).await;
            Err(LlmError::Retryable { status: Some(429), retry_after: Some(pause), message })
        }
        Err(e) => Err(e),
    }
}

fn attempt_record(
    attempt: u32,
    started_ms: i64,
    elapsed: Duration,
    result: &Result<Completion, LlmError>,
) -> AttemptRecord {
    let (http_status, error, outcome) = match result {
        Ok(_) => (Some(200), None, AttemptOutcome::Success),
        Err(e) => (e.status(), Some(sanitize_error(e.message())), AttemptOutcome::Retry),
    };
    AttemptRecord {
        attempt,
        started_at: rfc3339_from_millis(started_ms),
        duration_ms: elapsed.as_millis() as u64,
        http_status,
        error,
        outcome,
        prompt_tokens: result.as_ref().ok().and_then(|c| c.prompt_tokens),
        completion_tokens: result.as_ref().ok().and_then(|c| c.completion_tokens),
        timed_out: false,
    }
}

/// The registered, enabled tools as OpenAI function specs, then a seed 001 agent's: its tool
/// configurations (each overridden argument hidden) and, in a step that may hand off, the
/// transition tool. Each tool as it was when the step was asked for (`Cx::tools_since`, one read
/// for all): a description changed before the user's message reaches the model that answers it.
async fn configured_specs(step: &ClaimedStep<'_>, state: &TurnState) -> Vec<Value> {
    let configured: Vec<(&String, &_)> =
        state.agent.as_ref().map(|a| a.config.tool_configurations.iter().collect()).unwrap_or_default();
    let mut names: Vec<&str> = state.assistant.enabled_tools.iter().map(String::as_str).collect();
    names.extend(configured.iter().map(|(_, c)| c.tool_name.as_str()));
    let known = step.cx.tools_since(&names, step.envelope.enqueued_at_ms).await.unwrap_or_default();
    let (enabled, of_configured) = known.split_at(state.assistant.enabled_tools.len().min(known.len()));
    let mut specs = Vec::new();
    for known in enabled.iter().flatten() {
        let tool = &known.stored;
        let name = fleet_protocol::tools::model_function_name(&tool.name);
        specs.push(json!({"type": "function", "function": {"name": name, "description": tool.description, "parameters": tool.parameters}}));
    }
    let Some(agent) = &state.agent else { return specs };
    for ((name, configured), known) in configured.iter().zip(of_configured) {
        if let Some(known) = known {
            let tool = &known.stored;
            let mut parameters = tool.parameters.clone();
            for path in configured.argument_overrides.keys() {
                fleet_protocol::agent_config::hide_path(&mut parameters, path);
            }
            let description = configured.description.as_ref().unwrap_or(&tool.description);
            specs.push(json!({"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}));
        }
    }
    specs.extend(agent.config.transition_spec(state.step()));
    specs
}

/// Every tool the turn's answer call offers: the enabled and configured ones, then `load_image`
/// while the session holds images.
async fn tool_specs(step: &ClaimedStep<'_>, state: &TurnState) -> Vec<Value> {
    let mut specs = configured_specs(step, state).await;
    specs.extend(images::offered(&step.cx, state).await);
    specs
}

/// The JSON-schema response format an answer in the turn's step must match, if any.
fn response_format(state: &TurnState) -> Option<Value> {
    let (name, schema) = state.agent.as_ref()?.config.answer_schema(state.step())?;
    Some(json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": false}}))
}

/// Every model attempt leaves a log line, like a callback attempt: duration, outcome, tokens.
fn log_model_attempt(attempt: u32, elapsed: Duration, result: &Result<Completion, LlmError>) {
    let duration_ms = elapsed.as_millis() as u64;
    match result {
        Ok(c) => tracing::info!(
            attempt,
            duration_ms,
            finish_reason = c.finish_reason.as_deref(),
            prompt_tokens = c.prompt_tokens,
            completion_tokens = c.completion_tokens,
            "model attempt finished"
        ),
        Err(e) => {
            tracing::warn!(attempt, duration_ms, http_status = e.status(), error = e.message(), "model attempt failed")
        }
    }
}
