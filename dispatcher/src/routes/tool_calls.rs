//! `POST /v1/tool-calls`: a tool call checked against its tool's schema, then accepted as a job (at
//! once, or scheduled with `run_at` / `delay_seconds`); `POST /v1/tool-calls/batch`: up to 1,000 of
//! them checked all or nothing, then accepted together.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use fleet_platform::now_ms;
use fleet_platform::store::NewExecution;
use fleet_platform::telemetry;
use fleet_protocol::envelope::{Envelope, Job, JobKind, ToolCallJob};
use fleet_protocol::fair::Priority;
use fleet_protocol::schedule;

use crate::error::ApiError;
use crate::routes::common::{JsonInput, RequestKey, Tenancy};
use crate::routes::submit::{submit, AcceptedJob, Recording, Submission};
use crate::routes::submit_batch::{submit_batch, BatchResult};
use crate::wire::Data;
use crate::{validate, AppState};

/// The most calls one batch may hold.
pub(crate) const MAX_BATCH_CALLS: usize = 1000;

#[derive(Deserialize, ToSchema)]
#[schema(as = ToolCallRequest)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolCallInput {
    /// A registered tool's name.
    tool_name: String,
    /// Checked against the tool's `parameters` schema.
    parameters: Map<String, Value>,
    room_id: Option<String>,
    assistant_id: Option<String>,
    /// RFC 3339, e.g. `2026-01-20T12:00:00Z`: the call runs then (at once if that is past); at
    /// most 30 days ahead. Not with `delay_seconds`.
    run_at: Option<String>,
    /// Seconds from now (fractions allowed, 0 or more, at most 30 days) before the call runs. Not
    /// with `run_at`.
    delay_seconds: Option<f64>,
    /// Whose call it is (1-64 of `A-Z a-z 0-9 . _ -`): a tenant-bound token's tenant (a different
    /// one is refused), else this, else the token's name.
    tenant: Option<String>,
    /// Its order among its tenant's new calls (default `normal`): as a tenant's calls come faster
    /// than its light lane allows, its `low` calls leave the lane for the work queue first and its
    /// `high` ones last.
    priority: Option<Priority>,
    // Whose call it is, once `check` decided it.
    #[serde(skip)]
    #[schema(ignore)]
    owner: Option<String>,
    // When the call is due (ms), once `check` decided it; `None` runs it now.
    #[serde(skip)]
    #[schema(ignore)]
    due_ms: Option<i64>,
}

/// Up to 1,000 tool calls accepted together.
#[derive(Deserialize, ToSchema)]
#[schema(as = BatchRequest)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchInput {
    /// 1 to 1,000 calls, each what `POST /v1/tool-calls` takes. One invalid call refuses the whole
    /// batch (422 naming it: `calls[17].parameters: …`) before anything is published.
    calls: Vec<ToolCallInput>,
}

impl ToolCallInput {
    /// A call the fleet makes of its own tool (a data source's check, extraction or API query):
    /// the caller checked it, so it is not held to the tool's schema, and it is the operator's
    /// unless `tenant` names whose.
    pub(crate) fn internal(tool_name: String, parameters: Map<String, Value>, tenant: Option<String>) -> Self {
        ToolCallInput {
            tool_name,
            parameters,
            room_id: None,
            assistant_id: None,
            run_at: None,
            delay_seconds: None,
            tenant: None,
            priority: Some(Priority::High),
            owner: Some(tenant.unwrap_or_else(|| "operator".into())),
            due_ms: None,
        }
    }

    /// The bytes of this call a job carries (its parameters and labels as JSON).
    fn carried_bytes(&self) -> usize {
        let labels = [Some(&self.tool_name), self.room_id.as_ref(), self.assistant_id.as_ref()];
        let parameters = serde_json::to_vec(&self.parameters).map_or(usize::MAX, |p| p.len());
        parameters.saturating_add(labels.into_iter().flatten().map(String::len).sum())
    }

    /// Checks the call (its tool exists and the parameters satisfy its schema) and decides when it
    /// is due; a refusal names the field it is about.
    async fn check(&mut self, state: &AppState, tenancy: &Tenancy) -> Result<(), (&'static str, ApiError)> {
        validate::called_tool_name(&self.tool_name).map_err(|e| ("tool_name", e))?;
        self.owner = Some(tenancy.resolve(self.tenant.as_deref()).map_err(|e| ("tenant", e))?);
        validate::identifier("room_id", self.room_id.as_deref()).map_err(|e| ("room_id", e))?;
        validate::identifier("assistant_id", self.assistant_id.as_deref()).map_err(|e| ("assistant_id", e))?;
        labels_seen_by(state, tenancy, self.room_id.as_deref(), self.assistant_id.as_deref()).await?;
        // A bound caller's session label is its tenant's own session of that key.
        self.room_id = self.room_id.as_deref().map(|r| tenancy.session(r));
        self.due_ms = schedule::due_at(self.run_at.as_deref(), self.delay_seconds, now_ms())
            .map_err(|e| (e.field(), ApiError::invalid(e.to_string())))?;
        crate::tool_schemas::check_call(&state.tool_schemas, state.store.registry(), &self.tool_name, &self.parameters)
            .await
            .map_err(|e| ("parameters", e))
    }
}

/// A tenant-bound caller's labels name nothing of another tenant's: a `room_id` that is another
/// tenant's room or an `assistant_id` of another tenant's assistant is 404,
/// as if it did not exist, so no tool owner, listing or usage count takes the call for theirs.
/// A label that names nothing stored is the caller's own.
async fn labels_seen_by(
    state: &AppState,
    tenancy: &Tenancy,
    room: Option<&str>,
    assistant: Option<&str>,
) -> Result<(), (&'static str, ApiError)> {
    if tenancy.bound.is_none() {
        return Ok(());
    }
    // Any other key a bound caller names is its own tenant's session of that key (it is mapped
    // so), which no other tenant's can be: only a room's id, one session whoever names it, is read.
    if let Some(room) = room.filter(|r| fleet_protocol::agents::is_id("room_", r)) {
        let owner = state.store.sessions().session_tenant(room).await.map_err(|e| ("room_id", e.into()))?;
        if owner.is_some() && !tenancy.sees(owner.as_deref()) {
            return Err(("room_id", ApiError::not_found(format!("room_id: no room or session {room:?}"))));
        }
    }
    if let Some(id) = assistant.filter(|id| fleet_protocol::agents::is_id("asst_", id)) {
        let found = state.store.registry().read_assistant(id).await.map_err(|e| ("assistant_id", e.into()))?;
        if found.is_some_and(|v| !v.record.seen_by(tenancy.bound.as_deref())) {
            return Err(("assistant_id", ApiError::not_found(format!("assistant_id: no assistant {id:?}"))));
        }
    }
    Ok(())
}

#[utoipa::path(post, path = "/v1/tool-calls", extensions(("x-tenancy" = json!("own"))), tag = "tool-calls", security(("bearer" = ["calls:write"])),
    params(("Idempotency-Key" = Option<String>, Header, description = "1-255 visible ASCII characters; a retry with the same key and body returns the same execution")),
    request_body = ToolCallInput,
    responses((status = 202, description = "Accepted: the broker confirmed the job", body = Data<AcceptedJob>,
            headers(("idempotent-replayed" = String, description = "`true` when the answer replays an earlier request's"))),
        (status = 409, description = "A request with this key is still being accepted (`request_in_progress`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn create_tool_call(
    State(state): State<AppState>,
    tenancy: Tenancy,
    RequestKey(idempotency_key): RequestKey,
    headers: HeaderMap,
    JsonInput { value: mut input, raw }: JsonInput<ToolCallInput>,
) -> Result<Response, ApiError> {
    if !fleet_protocol::envelope::request_fits_a_job(raw.len()) {
        return Err(too_large_for_a_job(raw.len()));
    }
    input.check(&state, &tenancy).await.map_err(|(_, e)| e)?;
    submit(&state, idempotency_key, &headers, input).await
}

#[utoipa::path(post, path = "/v1/tool-calls/batch", extensions(("x-tenancy" = json!("own"))), tag = "tool-calls", security(("bearer" = ["calls:write"])),
    params(("Idempotency-Key" = Option<String>, Header, description = "1-255 visible ASCII characters; a retry with the same key and body returns the same execution ids and publishes nothing twice")),
    request_body = BatchInput,
    responses((status = 202, description = "Accepted: the broker confirmed every call", body = Data<BatchResult>,
            headers(("idempotent-replayed" = String, description = "`true` when the answer replays an earlier request's"))),
        (status = 207, description = "Accepted in part (a broker failure during the publish): each call's result, in request order; \
            a call with `error.code` `broker_unavailable` was not accepted, one with `outcome_unknown` may run. \
            Retry with the same `Idempotency-Key` to publish the calls not confirmed (the same execution ids)", body = Data<BatchResult>),
        (status = 409, description = "A request with this key is still being accepted (`request_in_progress`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn create_tool_call_batch(
    State(state): State<AppState>,
    tenancy: Tenancy,
    RequestKey(idempotency_key): RequestKey,
    headers: HeaderMap,
    JsonInput { value: BatchInput { mut calls }, raw }: JsonInput<BatchInput>,
) -> Result<Response, ApiError> {
    if calls.is_empty() || calls.len() > MAX_BATCH_CALLS {
        return Err(ApiError::invalid(format!("calls: must hold 1 to {MAX_BATCH_CALLS} calls, not {}", calls.len())));
    }
    // Only a batch too large for one job can hold a call too large for one: measured only then.
    if !fleet_protocol::envelope::request_fits_a_job(raw.len()) {
        for (i, call) in calls.iter().enumerate() {
            let size = call.carried_bytes();
            if !fleet_protocol::envelope::request_fits_a_job(size) {
                return Err(in_batch(i, "parameters", too_large_for_a_job(size)));
            }
        }
    }
    // All or nothing: one bad call refuses the batch before anything is written or published.
    for (i, call) in calls.iter_mut().enumerate() {
        call.check(&state, &tenancy).await.map_err(|(field, e)| in_batch(i, field, e))?;
    }
    let span = tracing::info_span!(
        "tool_call_batch",
        otel.name = "POST /v1/tool-calls/batch",
        otel.kind = "server",
        http.request.method = "POST",
        http.route = "/v1/tool-calls/batch",
        calls = calls.len(),
    );
    telemetry::set_parent(&span, telemetry::from_http_headers(&headers));
    submit_batch(&state, idempotency_key, span, calls).await
}

/// A call too large to travel as a job with its retries' headroom (the envelope limit).
fn too_large_for_a_job(bytes: usize) -> ApiError {
    let most = fleet_protocol::envelope::MAX_ENVELOPE_BYTES
        - fleet_protocol::envelope::ENVELOPE_HEADROOM_BYTES
        - fleet_protocol::envelope::ENVELOPE_OVERHEAD_BYTES;
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "job_too_large",
        format!("parameters: the call is {bytes} bytes; a job carries at most {most} (the envelope limit less its retries' headroom)"),
    )
}

/// A call's refusal as the batch's: the message names the call's index and field.
fn in_batch(index: usize, field: &str, e: ApiError) -> ApiError {
    let detail = e.message.strip_prefix(&format!("{field}: ")).unwrap_or(&e.message);
    let message = format!("calls[{index}].{field}: {detail}");
    ApiError { message, ..e }
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

    /// Records the execution (unless a republish finds it) and builds the job: a scheduled call's
    /// envelope carries `not_before_ms`, which sends it to a delay queue first.
    async fn record(&self, state: &AppState, execution_id: &str, recording: Recording) -> Result<Envelope, ApiError> {
        let now = now_ms();
        let mut due_ms = self.due_ms;
        // A republished execution may already have run: its record is not reset, and it stays due
        // when it was first due.
        let existing =
            if recording.republish() { state.store.executions().get_execution(execution_id).await? } else { None };
        match existing {
            Some(view) => due_ms = view.record.run_at_ms.or(due_ms),
            None => {
                let record = NewExecution {
                    execution_id,
                    kind: JobKind::ToolCall,
                    tool_name: Some(&self.tool_name),
                    room_id: self.room_id.as_deref(),
                    assistant_id: self.assistant_id.as_deref(),
                    tenant: self.owner.as_deref(),
                    now_ms: now,
                    run_at_ms: due_ms,
                };
                state.store.executions().create_execution(&record, None).await?;
            }
        }
        let job = Job::ToolCall(ToolCallJob {
            tool_name: self.tool_name.clone(),
            parameters: Value::Object(self.parameters.clone()),
            room_id: self.room_id.clone(),
            assistant_id: self.assistant_id.clone(),
            parent: None,
        });
        let mut envelope = Envelope::new(execution_id.to_string(), job, now);
        envelope.not_before_ms = due_ms;
        Ok(envelope)
    }

    fn lane(&self) -> Option<(JobKind, &str, fleet_protocol::fair::Priority)> {
        Some((JobKind::ToolCall, self.owner.as_deref().unwrap_or_default(), self.priority.unwrap_or_default()))
    }

    async fn undo(&self, state: &AppState, execution_id: &str, recorded: bool) {
        // A record that failed to be written is not there to remove.
        if recorded {
            let _ = state.store.executions().delete_execution(execution_id).await;
        }
    }
}

/// A digest of what the request asks for (not of its bytes: key order and spacing do not count).
fn body_digest(input: &ToolCallInput) -> String {
    let mut canonical = json!({
        "tool_name": input.tool_name,
        "parameters": input.parameters,
        "room_id": input.room_id,
        "assistant_id": input.assistant_id,
    });
    // Only when given, so that keys stored before scheduling existed still match.
    if let Some(run_at) = &input.run_at {
        canonical["run_at"] = json!(run_at);
    }
    if let Some(delay) = input.delay_seconds {
        canonical["delay_seconds"] = json!(delay);
    }
    if let Some(tenant) = &input.tenant {
        canonical["tenant"] = json!(tenant);
    }
    if let Some(priority) = input.priority {
        canonical["priority"] = json!(priority);
    }
    hex::encode(Sha256::digest(serde_json::to_vec(&canonical).expect("JSON serialises")))
}

/// This module's routes, each with its OpenAPI operation (path, method, scope): adding a route
/// here is all it takes to serve, document and guard it.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(create_tool_call))
        .routes(utoipa_axum::routes!(create_tool_call_batch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_priority_is_one_of_three_and_counts_in_the_body_digest() {
        let parse = |s: &str| validate::parse_body::<ToolCallInput>(s.as_bytes());
        let high = parse(r#"{"tool_name":"t","parameters":{},"priority":"high"}"#).ok().unwrap();
        assert_eq!(high.priority, Some(Priority::High));
        let plain = parse(r#"{"tool_name":"t","parameters":{}}"#).ok().unwrap();
        assert_ne!(body_digest(&high), body_digest(&plain));
        let refused = parse(r#"{"tool_name":"t","parameters":{},"priority":"urgent"}"#).err().unwrap();
        assert!(refused.message.contains("priority"), "{}", refused.message);
    }

    #[test]
    fn the_body_digest_ignores_key_order_and_spacing_but_not_content() {
        let parse = |s: &str| validate::parse_body::<ToolCallInput>(s.as_bytes()).unwrap();
        let a = parse(r#"{"tool_name":"t","parameters":{"a":1,"b":2},"room_id":"r"}"#);
        let b = parse(r#"{ "room_id": "r", "parameters": {"b": 2, "a": 1}, "tool_name": "t" }"#);
        let c = parse(r#"{"tool_name":"t","parameters":{"a":1,"b":3},"room_id":"r"}"#);
        assert_eq!(body_digest(&a), body_digest(&b));
        assert_ne!(body_digest(&a), body_digest(&c));
        let later = parse(r#"{"tool_name":"t","parameters":{"a":1,"b":2},"room_id":"r","delay_seconds":3}"#);
        assert_ne!(body_digest(&a), body_digest(&later));
    }

    #[test]
    fn a_refused_call_in_a_batch_names_its_index_and_field_once() {
        let e = in_batch(17, "run_at", ApiError::invalid("run_at: is more than 30 days ahead"));
        assert_eq!(e.message, "calls[17].run_at: is more than 30 days ahead");
        let e = in_batch(3, "parameters", ApiError::invalid("parameters do not match"));
        assert_eq!((e.message.as_str(), e.code), ("calls[3].parameters: parameters do not match", "invalid_request"));
    }
}
