//! One model call of a turn: the request (instructions, history, conversation, enabled tools),
//! tokens streamed to the session under this attempt's message id, the claim renewed throughout
//! (a model may think longer than the lease), and the attempt recorded like a callback attempt.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tracing::Instrument;

use fleet_platform::now_ms;
use fleet_protocol::envelope::{Envelope, TurnJob};
use fleet_protocol::execution::{AttemptOutcome, AttemptRecord, ExecutionStatus};
use fleet_protocol::sanitize::sanitize_error;
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::turn::{self, Completion, Message, TurnState};

use super::super::renewing;
use super::emit;
use crate::llm::{ChatRequest, LlmError};
use crate::process::Processor;
use crate::settle::{Failure, Held, Outcome};

pub(super) async fn call(
    p: &Processor,
    envelope: &Envelope,
    job: &TurnJob,
    state: &mut TurnState,
    held: &Held,
) -> Result<Completion, Outcome> {
    let turn_id = &envelope.execution_id;
    let config = &state.assistant.model_config;
    let model = config.model.clone().unwrap_or_else(|| p.llm.default_model().to_string());
    let provider = config.provider.clone();
    let request = ChatRequest {
        model: &model,
        temperature: Some(config.temperature.unwrap_or(turn::DEFAULT_TEMPERATURE)),
        max_tokens: config.max_tokens.unwrap_or(p.config.llm_max_tokens),
        messages: state.conversation.iter().map(Message::to_openai).collect(),
        tools: tool_specs(p, state).await,
    };
    // Every attempt streams under its own message id: a retried attempt's tokens are never mixed
    // with the next one's (the client is told to drop them with a `retry` event).
    state.message_id = turn::attempt_message_id(turn_id, job.round, envelope.attempt);
    let (message_id, session) = (state.message_id.clone(), state.session_id.clone());
    let span =
        tracing::info_span!("llm", otel.name = "chat.completions", otel.kind = "client", gen_ai.request.model = %model);
    let traceparent = fleet_platform::telemetry::http_headers(&span);
    let started_ms = now_ms();
    let clock = Instant::now();
    let index = AtomicU64::new(0);
    let on_token = |token: String| {
        let event = turn::token_event(&token, index.fetch_add(1, Ordering::Relaxed), &message_id);
        emit(p, &session, event)
    };
    let streamed = complete_with_fallback(p, provider.as_deref(), request, traceparent, &index, &on_token);
    let Some(result) = renewing(p, held, true, streamed.instrument(span)).await else {
        return Err(Outcome::Fenced);
    };
    let elapsed = clock.elapsed();
    p.metrics.llm_request_duration.with_label_values(&[&model]).observe(elapsed.as_secs_f64());
    log_model_attempt(envelope.attempt, elapsed, &result);
    let record = attempt_record(envelope.attempt, started_ms, elapsed, &result);
    let completion = match result {
        Ok(completion) => completion,
        Err(e) => {
            let (retry_after, permanent) = match &e {
                LlmError::Retryable { retry_after, .. } => (*retry_after, false),
                LlmError::Permanent { .. } => (None, true),
            };
            let error = e.message().to_string();
            return Err(Outcome::Failed(Failure {
                record,
                error,
                retry_after,
                permanent,
                held: held.clone(),
                started_ms,
            }));
        }
    };
    state.usage.prompt_tokens += completion.prompt_tokens.unwrap_or(0);
    state.usage.completion_tokens += completion.completion_tokens.unwrap_or(0);
    for (kind, n) in [("prompt", completion.prompt_tokens), ("completion", completion.completion_tokens)] {
        if let Some(n) = n {
            p.metrics.llm_tokens.with_label_values(&[&model, kind]).inc_by(n);
        }
    }
    let recorded =
        p.store.record_attempt(turn_id, &record, ExecutionStatus::Running, None, now_ms(), Some(held.fence)).await;
    if let Ok(false) = recorded {
        return Err(Outcome::Fenced);
    }
    Ok(completion)
}

/// Calls the turn's provider; after a retryable failure before any token streamed (`streamed`
/// still 0), its fallback provider once, within the same attempt and under the same message id.
async fn complete_with_fallback<F, Fut>(
    p: &Processor,
    provider: Option<&str>,
    request: ChatRequest<'_>,
    traceparent: Vec<(String, String)>,
    streamed: &AtomicU64,
    on_token: F,
) -> Result<Completion, LlmError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (name, client) = p.llm.get(provider)?;
    let fallback = p.llm.fallback_of(name).map(|f| (f, request.clone(), traceparent.clone()));
    let first = client.complete(request, traceparent, &on_token).await;
    let Some((fallback, request, traceparent)) = fallback else { return first };
    match first {
        Err(LlmError::Retryable { message, .. }) if streamed.load(Ordering::Relaxed) == 0 => {
            tracing::warn!(provider = name, fallback, error = %message, "model provider failed; trying its fallback");
            let (_, client) = p.llm.get(Some(fallback))?;
            client.complete(request, traceparent, &on_token).await
        }
        other => other,
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
    }
}

/// The registered, enabled tools as OpenAI function specs.
async fn tool_specs(p: &Processor, state: &TurnState) -> Vec<Value> {
    let mut specs = Vec::new();
    for name in &state.assistant.enabled_tools {
        if let Ok(Some(tool)) = p.store.get_tool(name).await {
            specs.push(json!({"type": "function", "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters}}));
        }
    }
    specs
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
