//! The OpenAPI document's shared parts: the schemas of request and response bodies, the error
//! responses every route can give, and the bearer scheme with its scopes. The paths come from
//! each handler's `#[utoipa::path]`, joined with the router itself (`routes::documented`), so no
//! route can be served without being documented.

// The body types below exist for their schemas only: handlers build the same shapes, and
// `make check-api` (schemathesis) holds every response to them.
#![allow(dead_code)]

use serde_json::{Map, Value};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoResponses, Modify, OpenApi, ToSchema};

/// The document's fixed parts; `routes::openapi` adds the paths.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "fleet dispatcher",
        description = "The fleet's HTTP API: tool registry, tool calls and agent turns as durable jobs, \
                       sessions, executions, dead letters, webhooks. Every route but this document needs \
                       `Authorization: Bearer <token>`; a token may be limited to scopes (see each \
                       operation's security requirement).",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "tools", description = "The tool registry"),
        (name = "tool-calls", description = "Tool calls as durable jobs"),
        (name = "turns", description = "Agent turns"),
        (name = "sessions", description = "A session's conversation and event stream"),
        (name = "executions", description = "What became of a job"),
        (name = "dead-letters", description = "Jobs that failed for good"),
        (name = "webhooks", description = "Event subscriptions"),
        (name = "meta", description = "This document"),
    )
)]
pub(crate) struct ApiDoc;

/// The name of the bearer scheme the operations' security requirements refer to.
pub(crate) const BEARER: &str = "bearer";

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "A token from FLEET_API_TOKENS. A plain token has every scope; `TOKEN:SCOPE+SCOPE` has only \
                 those. The scope an operation needs is listed in its security requirement; a token \
                 without it gets 403 `insufficient_scope`.",
            ))
            .build();
        components.add_security_scheme(BEARER, SecurityScheme::Http(scheme));
    }
}

// ---- errors ----

/// Every error: `{"error": {"code", "message"}}`.
#[derive(ToSchema)]
pub(crate) struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(ToSchema)]
pub(crate) struct ErrorDetail {
    /// A stable machine-readable code, e.g. `invalid_request`, `insufficient_scope`.
    pub code: String,
    /// What is wrong, naming the field or setting.
    pub message: String,
    /// The execution the error is about (`outcome_unknown`).
    pub execution_id: Option<String>,
    /// The scope the token lacks (`insufficient_scope`).
    pub required_scope: Option<String>,
}

/// The errors every authenticated route can answer with.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum CommonErrors {
    /// The request is not well-formed (bad JSON, wrong Content-Type, bad header).
    #[response(status = 400)]
    Malformed(ErrorBody),
    /// No valid bearer token.
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// The token lacks the operation's scope (`insufficient_scope`, naming it).
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// The body exceeds the size limit.
    #[response(status = 413)]
    TooLarge(ErrorBody),
    /// A field is invalid (the message names it).
    #[response(status = 422)]
    Invalid(ErrorBody),
    /// Redis or the broker is unavailable; nothing was accepted (or, for `outcome_unknown`, the
    /// job may run: retry with the same `Idempotency-Key`).
    #[response(status = 503)]
    Unavailable(ErrorBody),
    /// A stored record could not be read.
    #[response(status = 500)]
    Internal(ErrorBody),
}

// ---- shared ----

/// A job accepted (202): the broker confirmed it.
#[derive(ToSchema)]
pub(crate) struct AcceptedResponse {
    pub data: AcceptedJob,
}

#[derive(ToSchema)]
pub(crate) struct AcceptedJob {
    pub execution_id: String,
    /// `queued` for a fresh job; a replayed `Idempotency-Key` reports the execution's current status.
    pub status: ExecutionStatusName,
}

#[derive(ToSchema, serde::Deserialize)]
#[schema(as = ExecutionStatus)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ExecutionStatusName {
    Queued,
    Running,
    Retrying,
    Succeeded,
    Failed,
    DeadLettered,
    Cancelled,
}

// ---- tools ----

/// A tool's or webhook's own retry schedule (`null` or absent: the fleet's default, 6 attempts at
/// 0, 1, 2, 4, 8, 16 s). Waits are held by the broker; the window may be at most 72 h.
#[derive(ToSchema, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"attempts": 8, "delays": [5, 300, 1800, 7200, 18000, 36000, 36000]}))]
pub(crate) struct RetryDoc {
    /// Attempts in all, 1-20 (the first runs at once).
    #[schema(minimum = 1, maximum = 20)]
    pub attempts: u32,
    /// Whole seconds (≥ 1) before each attempt after the first: exactly `attempts - 1` entries,
    /// any order, adding up to at most 259200 (72 h).
    #[schema(max_items = 19)]
    pub delays: Vec<u64>,
}

/// A tool registration or update. On create, `callback_url` and `callback_secret` are required
/// (and `name` for `POST /v1/tools`); on update, fields left out keep their value.
#[derive(ToSchema, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolInputDoc {
    /// 1-64 letters, digits, `_` or `-`; must equal the path's name on `PUT`.
    pub name: Option<String>,
    /// At most 4096 characters.
    pub description: Option<String>,
    /// A JSON Schema (an object) the calls' parameters must satisfy.
    pub parameters: Option<Map<String, Value>>,
    /// An http(s) URL the worker POSTs signed calls to.
    pub callback_url: Option<String>,
    /// 16-1024 bytes; stored encrypted, never returned. Under `standard-webhooks`: `whsec_` and
    /// base64 of at least 24 bytes (the form the spec's libraries read).
    pub callback_secret: Option<String>,
    /// How callbacks are signed; `interactor` (the seed's) unless set.
    pub signature: Option<SignatureSchemeDoc>,
    /// With a new `callback_secret`: keep the previous one for `FLEET_SECRET_ROTATION_GRACE`
    /// (under `standard-webhooks` both sign until then).
    pub rotate_secret: Option<bool>,
    /// The tool's retry schedule; `null` goes back to the fleet's default.
    pub retry: Option<RetryDoc>,
    /// Callbacks in flight to this tool at once across the fleet (1-100000); `null` removes the limit.
    #[schema(minimum = 1, maximum = 100000, example = 2)]
    pub max_concurrency: Option<u32>,
    /// Callbacks per second across the fleet; `null` removes the limit.
    pub rate_limit: Option<RateLimitDoc>,
    /// The tool's circuit breaker (endpoint health); left out, the fleet's settings apply.
    pub circuit_breaker: Option<CircuitBreakerDoc>,
}

/// A tool's rate limit (GCRA): `per_second` on average, up to `burst` at once. Calls over it wait
/// in the broker without spending an attempt.
#[derive(ToSchema, serde::Deserialize)]
#[schema(as = RateLimit)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateLimitDoc {
    /// Greater than 0 (from 1/86400, one a day, to 100000).
    #[schema(minimum = 0.000011575, maximum = 100000, example = 5)]
    pub per_second: f64,
    /// 1-100000; left out or null: 1.
    #[schema(minimum = 1, maximum = 100000, example = 1)]
    pub burst: Option<u32>,
}

/// `interactor`: `X-Interactor-Signature: sha256=<hex>` over the body. `standard-webhooks`:
/// `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64>` (Standard Webhooks).
#[derive(ToSchema, serde::Deserialize)]
#[schema(as = SignatureScheme)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum SignatureSchemeDoc {
    Interactor,
    StandardWebhooks,
}

/// When a tool's circuit opens and how often it is probed while open.
#[derive(ToSchema, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"failure_threshold": 3, "probe_interval_seconds": 60}))]
pub(crate) struct CircuitBreakerDoc {
    /// Consecutive endpoint failures (5xx, 408, 429, timeouts, connection errors) that open the
    /// circuit, 0-100000 (0: never opens); default `FLEET_CIRCUIT_FAILURE_THRESHOLD` (0: never).
    #[schema(minimum = 0, maximum = 100000)]
    pub failure_threshold: Option<u32>,
    /// Seconds between probes while open (fleet-wide), 1-86400; default
    /// `FLEET_CIRCUIT_PROBE_INTERVAL` (30).
    #[schema(minimum = 1, maximum = 86400)]
    pub probe_interval_seconds: Option<u64>,
}

/// A tool's endpoint health (`GET /v1/tools/{tool}` only).
#[derive(ToSchema)]
pub(crate) struct ToolHealthDoc {
    /// `open`: calls are deferred and turns get `tool_unavailable`.
    #[schema(example = "closed")]
    pub state: String,
    pub consecutive_failures: u64,
    /// RFC 3339; null if never.
    pub last_success_at: Option<String>,
    pub last_failure_at: Option<String>,
    /// When the circuit opened; null while closed.
    pub opened_at: Option<String>,
}

#[derive(ToSchema)]
pub(crate) struct Tool {
    /// `tool_` and 32 hex digits.
    pub id: String,
    pub name: String,
    pub description: String,
    pub parameters: Map<String, Value>,
    pub callback_url: String,
    pub signature: SignatureSchemeDoc,
    /// RFC 3339: when the secret replaced by `rotate_secret` expires; null outside a rotation.
    pub previous_secret_expires_at: Option<String>,
    /// The tool's own retry schedule, or `null`: the fleet's default.
    pub retry: Option<RetryDoc>,
    /// Null: no limit.
    #[schema(minimum = 1, maximum = 100000)]
    pub max_concurrency: Option<u32>,
    /// Null: no limit.
    pub rate_limit: Option<RateLimitDoc>,
    /// The tool's own circuit breaker; null: the fleet's settings.
    pub circuit_breaker: Option<CircuitBreakerDoc>,
    /// Endpoint health, on `GET /v1/tools/{tool}`.
    pub health: Option<ToolHealthDoc>,
    /// RFC 3339.
    pub created_at: String,
    pub updated_at: String,
}

#[derive(ToSchema)]
pub(crate) struct ToolResponse {
    pub data: Tool,
}

#[derive(ToSchema)]
pub(crate) struct ToolList {
    pub data: Vec<Tool>,
    /// Pass as `cursor` for the next page; null at the end.
    pub next_cursor: Option<String>,
}

// ---- tool calls ----

#[derive(ToSchema, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolCallRequest {
    /// A registered tool's name.
    pub tool_name: String,
    /// Checked against the tool's `parameters` schema.
    pub parameters: Map<String, Value>,
    pub room_id: Option<String>,
    pub assistant_id: Option<String>,
    /// RFC 3339, e.g. `2026-01-20T12:00:00Z`: the call runs then (at once if that is past); at
    /// most 30 days ahead. Not with `delay_seconds`.
    pub run_at: Option<String>,
    /// Seconds from now (fractions allowed, 0 or more, at most 30 days) before the call runs. Not
    /// with `run_at`.
    pub delay_seconds: Option<f64>,
}

/// Up to 1,000 tool calls accepted together.
#[derive(ToSchema, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchRequest {
    /// 1 to 1,000 calls, each what `POST /v1/tool-calls` takes. One invalid call refuses the whole
    /// batch (422 naming it: `calls[17].parameters: …`) before anything is published.
    pub calls: Vec<ToolCallRequest>,
}

#[derive(ToSchema)]
pub(crate) struct BatchResponse {
    pub data: BatchResult,
}

#[derive(ToSchema)]
pub(crate) struct BatchResult {
    /// How many calls the broker confirmed.
    pub accepted: usize,
    /// How many it did not (0 with a 202).
    pub failed: usize,
    /// One result per call, in request order.
    pub calls: Vec<BatchCallResult>,
}

#[derive(ToSchema)]
pub(crate) struct BatchCallResult {
    /// `exec_<batch>_<index>`: the same again when the batch is retried with its `Idempotency-Key`.
    pub execution_id: String,
    /// An accepted call's status (`queued`; a replay reports the current one). Absent on error.
    pub status: Option<ExecutionStatusName>,
    /// A call not accepted: `broker_unavailable` (it was not accepted) or `outcome_unknown` (it
    /// may run); retry the batch with the same `Idempotency-Key`.
    pub error: Option<BatchCallError>,
}

#[derive(ToSchema)]
pub(crate) struct BatchCallError {
    pub code: String,
    pub message: String,
}

// ---- turns ----

#[derive(ToSchema, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TurnRequest {
    /// 1-256 characters without control characters.
    pub session_id: String,
    pub assistant: AssistantDoc,
    /// At least one message.
    pub messages: Vec<InputMessageDoc>,
    /// `follow_up` (default): queue after the running turn; `steer`: join it.
    pub behavior: Option<BehaviorDoc>,
}

#[derive(ToSchema, serde::Deserialize)]
#[schema(as = Assistant)]
#[serde(deny_unknown_fields)]
pub(crate) struct AssistantDoc {
    /// 1-256 characters; when absent, `name` stands for it (one of the two is required).
    pub id: Option<String>,
    /// The seed's assistant name (kept with the turn).
    pub name: Option<String>,
    /// The seed's display name (kept with the turn).
    pub title: Option<String>,
    /// The seed's description, at most 4 KiB (kept with the turn).
    pub description: Option<String>,
    /// The seed's creation time (RFC 3339), as an assistant object returned by the seed's API carries it.
    pub created_at: Option<String>,
    pub instructions: Option<String>,
    /// Every field optional: the fleet's defaults apply.
    pub model_config: Option<ModelConfigDoc>,
    /// Names of the tools the model may call.
    pub enabled_tools: Option<Vec<String>>,
}

#[derive(ToSchema, serde::Deserialize)]
#[schema(as = ModelConfig)]
#[serde(deny_unknown_fields)]
pub(crate) struct ModelConfigDoc {
    /// A configured provider (`FLEET_LLM_DEFAULT_PROVIDER`, default `openai`, or a name in
    /// `FLEET_LLM_PROVIDERS`); an unknown one is a 422. Default: `FLEET_LLM_DEFAULT_PROVIDER`.
    pub provider: Option<String>,
    /// Default: `FLEET_LLM_DEFAULT_MODEL` (`gpt-4o`).
    pub model: Option<String>,
    /// 0-2; default 0.7.
    pub temperature: Option<f64>,
    /// 1-1000000.
    pub max_tokens: Option<u32>,
}

#[derive(ToSchema, serde::Deserialize)]
#[schema(as = InputMessage)]
#[serde(deny_unknown_fields)]
pub(crate) struct InputMessageDoc {
    /// `user`, `system` or `assistant`.
    pub role: String,
    pub content: String,
}

#[derive(ToSchema, serde::Deserialize)]
#[schema(as = Behavior)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BehaviorDoc {
    FollowUp,
    Steer,
}

// ---- sessions ----

#[derive(ToSchema)]
pub(crate) struct MessagesResponse {
    pub data: MessagePage,
}

#[derive(ToSchema)]
pub(crate) struct MessagePage {
    /// The remembered messages: id, role, content, created_at, execution_id, and tool_calls
    /// (assistant) or tool_call_id (tool).
    pub messages: Vec<Map<String, Value>>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}

// ---- executions ----

/// The answer to `POST /v1/executions/{id}/cancel`.
#[derive(ToSchema)]
pub(crate) struct CancelResponse {
    pub data: CancelAnswer,
}

#[derive(ToSchema)]
pub(crate) struct CancelAnswer {
    pub execution_id: String,
    /// `cancelled` for a tool call or webhook delivery; a turn's current status (it becomes
    /// `cancelled` when its next step sees the request).
    pub status: ExecutionStatusName,
    /// What the cancel could not undo: an earlier attempt already sent, or a turn's model call
    /// under way.
    pub note: Option<String>,
}

#[derive(ToSchema)]
pub(crate) struct ExecutionResponse {
    pub data: Execution,
}

#[derive(ToSchema)]
pub(crate) struct Execution {
    pub execution_id: String,
    /// `tool_call`, `turn` or `webhook`.
    pub kind: String,
    pub status: ExecutionStatusName,
    pub tool_name: Option<String>,
    pub room_id: Option<String>,
    pub assistant_id: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    /// RFC 3339: when a scheduled call (`run_at`, `delay_seconds`) is due; it stays `queued`, with
    /// no attempt spent, until then. Null for a job that runs as soon as it can.
    pub run_at: Option<String>,
    /// Each attempt: attempt, started_at, duration_ms, outcome, and http_status or error.
    pub attempts: Vec<Map<String, Value>>,
    /// The tool's answer once succeeded.
    pub result: Option<Value>,
    pub last_error: Option<String>,
    /// A turn's model config (defaults applied), rounds, tool calls, final message and usage (turns only).
    pub turn: Option<Map<String, Value>>,
}

// ---- dead letters ----

#[derive(ToSchema)]
pub(crate) struct DeadLetterResponse {
    pub data: DeadLetter,
}

#[derive(ToSchema)]
pub(crate) struct DeadLetterList {
    pub data: Vec<DeadLetter>,
    /// Null only at the end (a page may be short, even empty, with a cursor).
    pub next_cursor: Option<String>,
}

#[derive(ToSchema)]
pub(crate) struct DeadLetter {
    pub execution_id: Option<String>,
    pub kind: Option<String>,
    pub tool_name: Option<String>,
    pub assistant_id: Option<String>,
    pub room_id: Option<String>,
    pub attempts: u32,
    pub last_error: String,
    pub first_attempt_at: Option<String>,
    pub last_attempt_at: Option<String>,
    pub reason: DeadLetterReasonDoc,
    pub dead_lettered_at: String,
    pub history: Vec<Map<String, Value>>,
    /// The job as published, for replay.
    pub job: Option<Map<String, Value>>,
    /// Poison only: what arrived (lossy UTF-8, truncated).
    pub raw_body: Option<String>,
}

#[derive(ToSchema, serde::Deserialize)]
#[schema(as = DeadLetterReason)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DeadLetterReasonDoc {
    Exhausted,
    Permanent,
    Poison,
    DeliveryLimit,
}

/// Which dead letters a bulk operation acts on (all filters optional; an empty body matches all).
#[derive(ToSchema, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BulkRequestDoc {
    pub execution_ids: Option<Vec<String>>,
    pub tool_name: Option<String>,
    pub reason: Option<DeadLetterReasonDoc>,
    /// RFC 3339.
    pub since: Option<String>,
    pub until: Option<String>,
    /// At most this many.
    pub limit: Option<u64>,
    /// Retries per second (0 < r <= 10000; default 50).
    pub rate_per_second: Option<f64>,
}

#[derive(ToSchema)]
pub(crate) struct SweepResponse {
    pub data: SweepReportDoc,
}

#[derive(ToSchema)]
#[schema(as = SweepReport)]
pub(crate) struct SweepReportDoc {
    pub scanned: u64,
    pub matched: u64,
    pub done: u64,
    pub not_replayable: u64,
}

// ---- webhooks ----

/// On create, all of `url`, `secret` and `events` are required; on update, fields left out keep
/// their value.
#[derive(ToSchema, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WebhookInputDoc {
    pub url: Option<String>,
    /// 16-1024 bytes; stored encrypted, never returned. Under `standard-webhooks`: `whsec_` and
    /// base64 of at least 24 bytes.
    pub secret: Option<String>,
    /// At least one known event.
    pub events: Option<Vec<String>>,
    /// How deliveries are signed; `interactor` (the seed's) unless set.
    pub signature: Option<SignatureSchemeDoc>,
    /// With a new `secret`: keep the previous one for `FLEET_SECRET_ROTATION_GRACE`.
    pub rotate_secret: Option<bool>,
    /// The webhook's retry schedule; `null` goes back to the fleet's default.
    pub retry: Option<RetryDoc>,
}

#[derive(ToSchema)]
pub(crate) struct Webhook {
    pub id: String,
    pub url: String,
    pub events: Vec<String>,
    pub signature: SignatureSchemeDoc,
    /// RFC 3339: when the secret replaced by `rotate_secret` expires; null outside a rotation.
    pub previous_secret_expires_at: Option<String>,
    /// The webhook's own retry schedule, or `null`: the fleet's default.
    pub retry: Option<RetryDoc>,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(ToSchema)]
pub(crate) struct WebhookResponse {
    pub data: Webhook,
}

#[derive(ToSchema)]
pub(crate) struct WebhookList {
    pub data: Vec<Webhook>,
    pub next_cursor: Option<String>,
}
