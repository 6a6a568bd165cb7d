//! `POST /v1/tool-calls`: a tool call checked against its tool's schema, then accepted as a job.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use fleet_platform::now_ms;
use fleet_platform::store::NewExecution;
use fleet_protocol::envelope::{Envelope, Job, ToolCallJob};

use crate::error::ApiError;
use crate::routes::common::{require_json, Body, Caller};
use crate::routes::submit::{publish, request_key, submit, EnqueueFailure, Submission};
use crate::{validate, AppState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolCallInput {
    tool_name: String,
    parameters: Map<String, Value>,
    room_id: Option<String>,
    assistant_id: Option<String>,
}

#[utoipa::path(post, path = "/v1/tool-calls", tag = "tool-calls", security(("bearer" = ["calls:write"])),
    params(("Idempotency-Key" = Option<String>, Header, description = "1-255 visible ASCII characters; a retry with the same key and body returns the same execution")),
    request_body = crate::routes::docs::ToolCallRequest,
    responses((status = 202, description = "Accepted: the broker confirmed the job", body = crate::routes::docs::AcceptedResponse,
            headers(("idempotent-replayed" = String, description = "`true` when the answer replays an earlier request's"))),
        (status = 409, description = "A request with this key is still being accepted (`request_in_progress`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn create_tool_call(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<Caller>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Response, ApiError> {
    require_json(&headers)?;
    let input: ToolCallInput = validate::parse_body(&body)?;
    validate::tool_name(&input.tool_name)?;
    validate::identifier("room_id", input.room_id.as_deref())?;
    validate::identifier("assistant_id", input.assistant_id.as_deref())?;
    let idempotency_key = request_key(&state, &caller, &headers)?;
    crate::tool_schemas::check_call(&state, &input.tool_name, &input.parameters).await?;
    submit(&state, idempotency_key, &headers, input).await
}

impl Submission for ToolCallInput {
    fn body_digest(&self) -> String {
        body_digest(self)
    }

    fn span(&self, execution_id: &str) -> tracing::Span {
        tracing::info_span!(
            "tool_call",
            otel.name = "POST /v1/tool-calls",
            otel.kind = "server",
            http.request.method = "POST",
            http.route = "/v1/tool-calls",
            execution_id = %execution_id,
        )
    }

    async fn enqueue(&self, state: &AppState, execution_id: &str, republish: bool) -> Result<(), EnqueueFailure> {
        enqueue(state, execution_id, self, republish).await
    }

    async fn undo(&self, state: &AppState, execution_id: &str, failure: &EnqueueFailure) {
        // Before the publish, the record itself is what failed to be written.
        if matches!(failure, EnqueueFailure::Publish(_)) {
            let _ = state.store.delete_execution(execution_id, "tool_call").await;
        }
    }
}

/// A digest of what the request asks for (not of its bytes: key order and spacing do not count).
fn body_digest(input: &ToolCallInput) -> String {
    let canonical = json!({
        "tool_name": input.tool_name,
        "parameters": input.parameters,
        "room_id": input.room_id,
        "assistant_id": input.assistant_id,
    });
    hex::encode(Sha256::digest(serde_json::to_vec(&canonical).expect("JSON serialises")))
}

/// Records the execution (unless a republish finds it), then publishes the job and waits for the
/// broker's confirm.
async fn enqueue(
    state: &AppState,
    execution_id: &str,
    input: &ToolCallInput,
    republish: bool,
) -> Result<(), EnqueueFailure> {
    // No record is written while the broker is certainly out of reach.
    state.broker.publisher().map_err(EnqueueFailure::Publish)?;
    let now = now_ms();
    let record = async {
        // A republished execution may already have run: its record is not reset.
        if republish && state.store.get_execution(execution_id).await?.is_some() {
            return Ok(());
        }
        state
            .store
            .create_execution(&NewExecution {
                execution_id,
                kind: "tool_call",
                tool_name: Some(&input.tool_name),
                room_id: input.room_id.as_deref(),
                assistant_id: input.assistant_id.as_deref(),
                now_ms: now,
            })
            .await
    };
    record.await.map_err(|e| EnqueueFailure::BeforePublish(e.into()))?;
    let job = Job::ToolCall(ToolCallJob {
        tool_name: input.tool_name.clone(),
        parameters: Value::Object(input.parameters.clone()),
        room_id: input.room_id.clone(),
        assistant_id: input.assistant_id.clone(),
        parent: None,
    });
    let envelope = Envelope::new(execution_id.to_string(), job, now);
    publish(state, &envelope).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_digest_ignores_key_order_and_spacing_but_not_content() {
        let parse = |s: &str| validate::parse_body::<ToolCallInput>(s.as_bytes()).unwrap();
        let a = parse(r#"{"tool_name":"t","parameters":{"a":1,"b":2},"room_id":"r"}"#);
        let b = parse(r#"{ "room_id": "r", "parameters": {"b": 2, "a": 1}, "tool_name": "t" }"#);
        let c = parse(r#"{"tool_name":"t","parameters":{"a":1,"b":3},"room_id":"r"}"#);
        assert_eq!(body_digest(&a), body_digest(&b));
        assert_ne!(body_digest(&a), body_digest(&c));
    }
}
