//! `POST /v1/turns`, and a turn's part of `GET /v1/executions/{id}`.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{json, Value};

use sha2::{Digest, Sha256};

use fleet_platform::now_ms;
use fleet_platform::store::NewExecution;
use fleet_protocol::envelope::{Envelope, Job, JobKind, TurnJob};
use fleet_protocol::turn::{self, TurnInput, TurnState};

use crate::error::ApiError;
use crate::routes::common::{require_json, Body, Caller};
use crate::routes::submit::{request_key, submit, Submission};
use crate::{validate, AppState};

/// Records the turn, puts it in its session's line (arrival order is run order), and publishes its
/// first step with a publisher confirm before answering 202; `Idempotency-Key` is honoured as on
/// `POST /v1/tool-calls` (the same `submit`).
#[utoipa::path(post, path = "/v1/turns", tag = "turns", security(("bearer" = ["turns:write"])),
    params(("Idempotency-Key" = Option<String>, Header, description = "1-255 visible ASCII characters; as on POST /v1/tool-calls")),
    request_body = crate::routes::docs::TurnRequest,
    responses((status = 202, description = "Accepted: the broker confirmed the turn's first step", body = crate::routes::docs::AcceptedResponse,
            headers(("idempotent-replayed" = String, description = "`true` when the answer replays an earlier request's"))),
        (status = 409, description = "A request with this key is still being accepted (`request_in_progress`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn create_turn(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Response, ApiError> {
    require_json(&headers)?;
    let mut input: TurnInput = validate::parse_body(&body)?;
    // The defaults are applied here, before the turn is stored: its state says which provider,
    // model and temperature run it, whatever the worker's settings.
    let routing = &state.config.common.llm;
    input.apply_defaults(&routing.default_provider, &routing.default_model);
    input.validate().map_err(ApiError::invalid)?;
    input.check_provider(&routing.names()).map_err(ApiError::invalid)?;
    let idempotency_key = request_key(&state, &caller, &headers)?;
    let canonical: Value = serde_json::from_slice(&body).map_err(|e| ApiError::malformed(e.to_string()))?;
    submit(&state, idempotency_key, &headers, NewTurn { input, canonical }).await
}

/// A turn as submitted: the parsed input, and the body as JSON for its `Idempotency-Key` digest.
struct NewTurn {
    input: TurnInput,
    canonical: Value,
}

impl Submission for NewTurn {
    fn body_digest(&self) -> String {
        turn_digest(&self.canonical)
    }

    fn span(&self, execution_id: &str) -> tracing::Span {
        tracing::info_span!("turn", otel.name = "POST /v1/turns", otel.kind = "server", execution_id = %execution_id)
    }

    async fn record(&self, state: &AppState, execution_id: &str, republish: bool) -> Result<Envelope, ApiError> {
        let input = &self.input;
        // The line entry is made before the record, so a republish that finds the record knows
        // the entry was made: the turn may have taken it (started) since, and it is not put back.
        if !(republish && state.store.get_execution(execution_id).await?.is_some()) {
            let turn = TurnState::new(input, turn::attempt_message_id(execution_id, 0, 1));
            state.store.save_turn(execution_id, &turn).await?;
            // Nothing was published without a record, so nothing has run: one entry, kept or made.
            state.store.session_enqueue(&input.session_id, execution_id).await?;
            state
                .store
                .create_execution(&NewExecution {
                    execution_id,
                    kind: JobKind::Turn.as_str(),
                    tool_name: None,
                    room_id: Some(&input.session_id),
                    assistant_id: Some(&input.assistant.id),
                    now_ms: now_ms(),
                    run_at_ms: None,
                })
                .await?;
        }
        let job = Job::Turn(TurnJob { session_id: input.session_id.clone(), round: 0 });
        Ok(Envelope::new(execution_id.to_string(), job, now_ms()))
    }

    async fn undo(&self, state: &AppState, execution_id: &str, _recorded: bool) {
        // A line entry without a job would hold up every later turn of the session.
        let _ = state.store.session_dequeue(&self.input.session_id, execution_id).await;
        let _ = state.store.delete_execution(execution_id, JobKind::Turn.as_str()).await;
    }
}

/// What a turn request asks for: its JSON with keys sorted and spacing dropped, apart from tool
/// calls' (a key sent to both routes is refused as reused, never replayed across them).
fn turn_digest(canonical: &Value) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"turn\n");
    hasher.update(serde_json::to_vec(canonical).expect("JSON serialises"));
    hex::encode(hasher.finalize())
}

/// The turn's part of `GET /v1/executions/{id}`: model config, rounds, tool calls, final message.
pub(crate) async fn turn_summary(state: &AppState, execution_id: &str) -> Result<Option<Value>, ApiError> {
    Ok(state.store.load_turn(execution_id).await?.map(|t| {
        json!({
            "session_id": t.session_id,
            "message_id": t.message_id,
            // The provider, model and temperature the turn runs with, its defaults applied.
            "model_config": t.assistant.model_config,
            "rounds": t.round,
            "tool_calls": t.tool_calls,
            "final_message": t.final_message,
            "usage": t.usage,
        })
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_turns_digest_ignores_key_order_and_spacing_but_not_content() {
        let parse = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        let a = parse(r#"{"session_id":"s","messages":[{"role":"user","content":"hi"}]}"#);
        let b = parse(r#"{ "messages": [ {"content": "hi", "role": "user"} ], "session_id": "s" }"#);
        let c = parse(r#"{"session_id":"s","messages":[{"role":"user","content":"ho"}]}"#);
        assert_eq!(super::turn_digest(&a), super::turn_digest(&b));
        assert_ne!(super::turn_digest(&a), super::turn_digest(&c));
    }
}
