//! HTTP routes: bearer-token auth, the tool registry, tool calls, executions and dead letters.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{FromRequest, MatchedPath, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use fleet_platform::broker::{BrokerError, PublishFailure};
use fleet_platform::dead_letters;
use fleet_platform::now_ms;
use fleet_platform::store::{ExecutionView, NewExecution, RequestHold, Reservation, StoredWebhook};
use fleet_platform::telemetry;
use fleet_protocol::deadletter::{DeadLetterFilter, DeadLetterReason, ListCursor};
use fleet_protocol::envelope::{Envelope, Job, ToolCallJob};
use fleet_protocol::execution::ExecutionStatus;
use fleet_protocol::timefmt::rfc3339_from_millis;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::error::ApiError;
use crate::validate;
use crate::AppState;

/// Which client a request came from: a digest of its token, to namespace its `Idempotency-Key`s.
#[derive(Clone)]
pub(crate) struct Caller(String);

pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/tools", get(crate::tools::list_tools).post(crate::tools::post_tool))
        .route(
            "/v1/tools/{tool}",
            put(crate::tools::put_tool).get(crate::tools::get_tool).delete(crate::tools::delete_tool),
        )
        .route("/v1/tool-calls", post(create_tool_call))
        .route("/v1/turns", post(crate::turns::create_turn))
        .route("/v1/sessions/{id}/stream", get(crate::turns::stream_session))
        .route("/v1/sessions/{id}/stream-token", post(crate::stream::create_stream_token))
        .route("/v1/sessions/{id}/messages", get(crate::sessions::list_messages))
        .route("/v1/sessions/{id}", axum::routing::delete(crate::sessions::delete_session))
        .route("/v1/webhooks", get(list_webhooks))
        .route("/v1/webhooks/{id}", put(put_webhook).get(get_webhook).delete(delete_webhook))
        .route("/v1/executions/{id}", get(get_execution))
        .route("/v1/dead-letters", get(list_dead_letters))
        .route("/v1/dead-letters/retry", post(retry_dead_letters))
        .route("/v1/dead-letters/purge", post(purge_dead_letters))
        .route("/v1/dead-letters/{id}", get(get_dead_letter).delete(delete_dead_letter))
        .route("/v1/dead-letters/{id}/retry", post(retry_dead_letter))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .fallback(|| async { ApiError::not_found("no such route") })
        .with_state(state.clone());
    let ready_state = state.clone();
    let readiness: fleet_platform::ops::ReadinessCheck = Arc::new(move || {
        let s = ready_state.clone();
        Box::pin(async move {
            if s.broker.current().is_none() {
                return Err("broker not connected".to_string());
            }
            s.store.ping().await.map_err(|e| e.to_string())
        })
    });
    v1.merge(fleet_platform::ops::router(state.metrics.clone(), readiness, None))
        .layer(axum::extract::DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(middleware::from_fn_with_state(state, record_metrics))
}

async fn record_metrics(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route =
        request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_else(|| "unmatched".into());
    let method = request.method().as_str().to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    let class = fleet_protocol::classify::status_class(response.status().as_u16());
    state.metrics.http_requests.with_label_values(&[&route, &method, class]).inc();
    state.metrics.http_request_duration.with_label_values(&[&route]).observe(started.elapsed().as_secs_f64());
    response
}

async fn require_token(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(token) = token else {
        // Only a session stream accepts a (stream) token in its query string instead.
        return match crate::stream::admit_by_stream_token(&state, request).await {
            Ok(request) => next.run(request).await,
            Err(refused) => refused.into_response(),
        };
    };
    let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    // Digests are compared, so timing reveals nothing about the tokens themselves.
    if !state.config.token_digests.contains(&digest) {
        return ApiError::unauthorized().into_response();
    }
    request.extensions_mut().insert(Caller(hex::encode(&digest[..16])));
    next.run(request).await
}

/// The raw body, with a too-large body answered as a JSON 413.
pub(crate) struct Body(pub(crate) Bytes);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(Body(bytes)),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                "request body exceeds the size limit",
            )),
            Err(rejection) => Err(ApiError::malformed(format!("cannot read request body: {rejection}"))),
        }
    }
}

pub(crate) fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    match headers.get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) {
        None => Ok(()),
        Some(ct) if ct.split(';').next().map(str::trim).is_some_and(|m| m.eq_ignore_ascii_case("application/json")) => {
            Ok(())
        }
        Some(other) => Err(ApiError::malformed(format!("Content-Type must be application/json, got {other:?}"))),
    }
}

// ---- shared by the registries ----

/// Refuses a callback host whose DNS answer includes a private address (the worker checks again
/// at connect time, so a later rebinding fails there).
pub(crate) async fn refuse_private_resolution(raw: &str) -> Result<(), ApiError> {
    let Ok(url) = url::Url::parse(raw) else { return Ok(()) };
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else { return Ok(()) };
    if host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[') {
        return Ok(());
    }
    let lookup = tokio::time::timeout(std::time::Duration::from_secs(2), tokio::net::lookup_host((host, port))).await;
    if let Ok(Ok(addrs)) = lookup {
        if addrs.into_iter().any(|a| fleet_protocol::ssrf::is_forbidden(a.ip())) {
            return Err(ApiError::invalid(
                "callback_url resolves to a loopback, private, link-local or metadata address, which is not allowed",
            ));
        }
    }
    Ok(())
}

#[derive(Deserialize)]
pub(crate) struct Page {
    pub(crate) cursor: Option<String>,
    pub(crate) limit: Option<usize>,
}

pub(crate) fn page_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    match limit.unwrap_or(50) {
        n @ 1..=200 => Ok(n),
        _ => Err(ApiError::invalid("limit must be between 1 and 200")),
    }
}

// ---- webhooks ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookInput {
    url: Option<String>,
    secret: Option<String>,
    events: Option<Vec<String>>,
}

fn webhook_json(h: &StoredWebhook) -> Value {
    json!({
        "id": h.id,
        "url": h.url,
        "events": h.events,
        "created_at": rfc3339_from_millis(h.created_at_ms),
        "updated_at": rfc3339_from_millis(h.updated_at_ms),
    })
}

async fn put_webhook(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Response, ApiError> {
    require_json(&headers)?;
    validate::tool_name(&id)
        .map_err(|_| ApiError::invalid("webhook id must be 1-64 characters of letters, digits, '_' or '-'"))?;
    let input: WebhookInput = validate::parse_body(&body)?;
    if let Some(url) = &input.url {
        validate::callback_url("url", url, state.config.allow_private_callbacks)?;
        if !state.config.allow_private_callbacks {
            refuse_private_resolution(url).await?;
        }
    }
    if let Some(secret) = &input.secret {
        if secret.len() < 16 || secret.len() > 1024 {
            return Err(ApiError::invalid("secret must be 16-1024 bytes"));
        }
    }
    if let Some(events) = &input.events {
        if events.is_empty() {
            return Err(ApiError::invalid("events must list at least one event"));
        }
        if let Some(unknown) = events.iter().find(|e| !fleet_protocol::events::is_known(e)) {
            return Err(ApiError::invalid(format!(
                "events: {unknown:?} is not an event; known events are {}",
                fleet_protocol::events::KNOWN_EVENTS.join(", ")
            )));
        }
    }
    let owner = format!("webhook:{id}");
    let now = now_ms();
    let hook = match state.store.get_webhook(&id).await? {
        Some(old) => StoredWebhook {
            id: id.clone(),
            url: input.url.unwrap_or(old.url),
            events: input.events.unwrap_or(old.events),
            secret_ciphertext: match input.secret {
                Some(s) => state.config.secrets_key.encrypt(&owner, &s),
                None => old.secret_ciphertext,
            },
            created_at_ms: old.created_at_ms,
            updated_at_ms: now,
        },
        None => StoredWebhook {
            id: id.clone(),
            url: input.url.ok_or_else(|| ApiError::invalid("url is required"))?,
            events: input.events.ok_or_else(|| ApiError::invalid("events is required"))?,
            secret_ciphertext: state
                .config
                .secrets_key
                .encrypt(&owner, &input.secret.ok_or_else(|| ApiError::invalid("secret is required"))?),
            created_at_ms: now,
            updated_at_ms: now,
        },
    };
    let created = state.store.put_webhook(&hook).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!({"data": webhook_json(&hook)}))).into_response())
}

async fn get_webhook(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let hook = state.store.get_webhook(&id).await?.ok_or_else(|| ApiError::not_found(format!("no webhook {id:?}")))?;
    Ok(Json(json!({"data": webhook_json(&hook)})))
}

async fn list_webhooks(State(state): State<AppState>, Query(page): Query<Page>) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(page.limit)?;
    let hooks = state.store.list_webhooks(page.cursor.as_deref(), limit + 1).await?;
    let next = (hooks.len() > limit).then(|| hooks[limit - 1].id.clone());
    let data: Vec<Value> = hooks.iter().take(limit).map(webhook_json).collect();
    Ok(Json(json!({"data": data, "next_cursor": next})))
}

async fn delete_webhook(State(state): State<AppState>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    if state.store.delete_webhook(&id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("no webhook {id:?}")))
    }
}

// ---- tool calls ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolCallInput {
    tool_name: String,
    parameters: Map<String, Value>,
    room_id: Option<String>,
    assistant_id: Option<String>,
}

async fn create_tool_call(
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
    crate::tools::check_call(&state, &input.tool_name, &input.parameters).await?;
    submit(&state, idempotency_key, &headers, input).await
}

/// The request's `Idempotency-Key` as its store key (namespaced by the caller), if it sent one.
pub(crate) fn request_key(state: &AppState, caller: &Caller, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else { return Ok(None) };
    let k = v.to_str().map_err(|_| ApiError::malformed("Idempotency-Key must be visible ASCII"))?;
    validate::idempotency_key(k)?;
    Ok(Some(state.store.keys().request_key(&caller.0, &hex::encode(Sha256::digest(k.as_bytes())))))
}

/// One kind of job a client submits (`POST /v1/tool-calls`, `POST /v1/turns`): what its
/// `Idempotency-Key` compares, how it is recorded and published, and what a refused one leaves.
/// Everything else about accepting a job is `submit`'s, the same for every kind.
pub(crate) trait Submission {
    /// A digest of what the request asks for (not of its bytes: key order and spacing do not count).
    fn body_digest(&self) -> String;
    /// The server span the enqueue runs in.
    fn span(&self, execution_id: &str) -> tracing::Span;
    /// Records the job (a republish keeps what an earlier attempt recorded), then publishes it and
    /// waits for the broker's confirm.
    async fn enqueue(&self, state: &AppState, execution_id: &str, republish: bool) -> Result<(), EnqueueFailure>;
    /// Removes what a first attempt wrote, once it is certain nothing was accepted.
    async fn undo(&self, state: &AppState, execution_id: &str, failure: &EnqueueFailure);
}

/// Accepts a job: reserves its `Idempotency-Key` (or answers from it), enqueues it, and answers 202
/// once the broker confirmed it, or refuses it by what the failure means.
pub(crate) async fn submit<S: Submission>(
    state: &AppState,
    idempotency_key: Option<String>,
    headers: &HeaderMap,
    submission: S,
) -> Result<Response, ApiError> {
    let (execution_id, hold) = match &idempotency_key {
        None => (fleet_protocol::new_execution_id(), None),
        Some(key) => match reserve(state, key, &submission.body_digest()).await? {
            Reserved::Answer(response) => return Ok(response),
            Reserved::Held(hold) => (hold.execution_id().to_string(), Some(hold)),
        },
    };
    let republish = hold.as_ref().is_some_and(|h| h.republish);
    let span = submission.span(&execution_id);
    let _ = span.set_parent(telemetry::from_http_headers(headers));
    let result = submission.enqueue(state, &execution_id, republish).instrument(span).await;
    match result {
        Ok(()) => {
            if let Some(hold) = &hold {
                // The job is durable: a lost key write only means that a retry with this key
                // publishes the same execution again once the reservation expires (a no-op).
                if let Err(e) = state.store.confirm_request(&hold.hold).await {
                    tracing::warn!(error = %e, execution_id, "accepted, but the Idempotency-Key was not recorded");
                }
            }
            Ok(accepted(state, &execution_id, republish).await)
        }
        Err(failure) => Err(refuse(state, &submission, &execution_id, hold.as_ref(), republish, failure).await),
    }
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

/// A request's hold on its `Idempotency-Key`, and whether it takes over an earlier attempt.
struct Held {
    hold: RequestHold,
    republish: bool,
}

impl std::ops::Deref for Held {
    type Target = RequestHold;
    fn deref(&self) -> &RequestHold {
        &self.hold
    }
}

enum Reserved {
    Answer(Response),
    Held(Held),
}

/// Reserves the key for this request, or answers from what the key already holds.
async fn reserve(state: &AppState, key: &str, body_digest: &str) -> Result<Reserved, ApiError> {
    let pending_for = state.config.common.publish_timeout + state.config.common.redis_timeout;
    let fresh = fleet_protocol::new_execution_id();
    Ok(match state.store.reserve_request(key, &fresh, body_digest, pending_for).await? {
        Reservation::New(hold) => Reserved::Held(Held { hold, republish: false }),
        Reservation::Unconfirmed(hold) => Reserved::Held(Held { hold, republish: true }),
        Reservation::Existing(previous) => Reserved::Answer(accepted(state, &previous, true).await),
        Reservation::InProgress => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "request_in_progress",
                "a request with this Idempotency-Key is still being accepted; retry shortly",
            ))
        }
        Reservation::Reused => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "this Idempotency-Key was already used with a different request body; use a new key",
            ))
        }
    })
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

/// Why an enqueue failed: before anything was published, or in the publish.
pub(crate) enum EnqueueFailure {
    BeforePublish(ApiError),
    Publish(BrokerError),
}

/// What a failed enqueue means for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FailureOutcome {
    /// Nothing was accepted: the record goes, the key is freed.
    NotAccepted,
    /// The job may run: the record and the key's mapping stay.
    Unknown,
}

/// `publish` is `None` when the failure came before the publish. A republish is never "not
/// accepted": an earlier attempt of the same execution may have reached the queue.
fn failure_outcome(publish: Option<PublishFailure>, republish: bool) -> FailureOutcome {
    match (publish, republish) {
        (_, true) | (Some(PublishFailure::Unknown), false) => FailureOutcome::Unknown,
        (None | Some(PublishFailure::NotSent), false) => FailureOutcome::NotAccepted,
    }
}

/// Undoes or keeps what the request wrote, by what the failure means, and builds its answer.
async fn refuse<S: Submission>(
    state: &AppState,
    submission: &S,
    execution_id: &str,
    hold: Option<&Held>,
    republish: bool,
    failure: EnqueueFailure,
) -> ApiError {
    let publish = match &failure {
        EnqueueFailure::BeforePublish(_) => None,
        EnqueueFailure::Publish(e) => Some(e.publish_failure()),
    };
    match failure_outcome(publish, republish) {
        FailureOutcome::NotAccepted => {
            // A request that outlived its reservation may find the key taken over by a retry that
            // republishes this execution: then the record is the retry's, and stays.
            let ours = match hold {
                Some(hold) => state.store.release_request(&hold.hold).await.unwrap_or(false),
                None => true,
            };
            if ours {
                submission.undo(state, execution_id, &failure).await;
            }
            match failure {
                EnqueueFailure::BeforePublish(e) => e,
                EnqueueFailure::Publish(e) => e.into(),
            }
        }
        FailureOutcome::Unknown => {
            if let Some(hold) = hold {
                let _ = state.store.abandon_request(&hold.hold).await;
            }
            let why = match failure {
                EnqueueFailure::BeforePublish(e) => e.message,
                EnqueueFailure::Publish(e) => e.to_string(),
            };
            tracing::warn!(execution_id, error = %why, "publish outcome unknown");
            ApiError::outcome_unknown(execution_id, &why)
        }
    }
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

/// Publishes a new job under a producer span and waits for the broker's confirm.
pub(crate) async fn publish(state: &AppState, envelope: &Envelope) -> Result<(), EnqueueFailure> {
    let publisher = state.broker.publisher().map_err(EnqueueFailure::Publish)?;
    let execution_id = envelope.execution_id.as_str();
    let topology = &state.config.common.topology;
    let exchange = topology.jobs_exchange();
    let routing_key = envelope.kind().as_str();
    let send = tracing::info_span!(
        "send",
        otel.name = format!("send {exchange}"),
        otel.kind = "producer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "send",
        messaging.destination.name = format!("{exchange}:{routing_key}"),
        messaging.rabbitmq.destination.routing_key = routing_key,
        messaging.message.id = execution_id,
    );
    let headers = telemetry::amqp_headers(&send);
    publisher.publish_job(topology, envelope, headers).instrument(send).await.map_err(EnqueueFailure::Publish)?;
    state.metrics.jobs_published.with_label_values(&[envelope.kind().as_str()]).inc();
    tracing::info!(execution_id, trace_id = %telemetry::trace_id(&tracing::Span::current()), "job accepted");
    Ok(())
}

/// The 202 body. A fresh job is `queued` (it may already be running: that is not this answer's
/// news); a replayed `Idempotency-Key` reports the execution's current status.
async fn accepted(state: &AppState, execution_id: &str, replayed: bool) -> Response {
    let status = match replayed {
        false => ExecutionStatus::Queued,
        true => match state.store.get_execution(execution_id).await {
            Ok(Some(view)) => view.status,
            _ => ExecutionStatus::Queued,
        },
    };
    let mut response =
        (StatusCode::ACCEPTED, Json(json!({"data": {"execution_id": execution_id, "status": status.as_str()}})))
            .into_response();
    if replayed {
        response.headers_mut().insert("idempotent-replayed", axum::http::HeaderValue::from_static("true"));
    }
    response
}

// ---- executions ----

fn execution_json(v: &ExecutionView) -> Value {
    json!({
        "execution_id": v.execution_id,
        "kind": v.kind,
        "status": v.status.as_str(),
        "tool_name": v.tool_name,
        "room_id": v.room_id,
        "assistant_id": v.assistant_id,
        "created_at": rfc3339_from_millis(v.created_at_ms),
        "updated_at": rfc3339_from_millis(v.updated_at_ms),
        "attempts": v.attempts,
        "result": v.result,
        "last_error": v.last_error,
    })
}

async fn get_execution(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    if !fleet_protocol::envelope::is_valid_execution_id(&id) {
        return Err(ApiError::not_found(format!("no execution {id:?}")));
    }
    let view =
        state.store.get_execution(&id).await?.ok_or_else(|| ApiError::not_found(format!("no execution {id:?}")))?;
    let mut data = execution_json(&view);
    if view.kind == "turn" {
        if let Some(turn) = crate::turns::turn_summary(&state, &id).await? {
            data["turn"] = turn;
        }
    }
    Ok(Json(json!({"data": data})))
}

// ---- dead letters ----

async fn get_dead_letter(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let record = state
        .store
        .get_dead_letter(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no dead letter for {id:?}")))?;
    Ok(Json(json!({"data": record})))
}

#[derive(Deserialize)]
struct DeadLetterQuery {
    cursor: Option<String>,
    limit: Option<usize>,
    tool_name: Option<String>,
    reason: Option<DeadLetterReason>,
    since: Option<String>,
    until: Option<String>,
}

/// Newest first, filtered by tool, reason and time range; `next_cursor` continues the listing. One
/// request looks at a bounded number of index entries: a page may come back short (even empty)
/// with a `next_cursor` when few match, and only `next_cursor: null` means the end.
async fn list_dead_letters(
    State(state): State<AppState>,
    Query(q): Query<DeadLetterQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(q.limit)?;
    let filter = DeadLetterFilter {
        execution_ids: vec![],
        tool_name: q.tool_name,
        reason: q.reason,
        since: q.since,
        until: q.until,
    };
    filter.validate().map_err(|field| ApiError::invalid(format!("{field} must be an RFC 3339 timestamp")))?;
    let cursor = match q.cursor.as_deref() {
        Some(c) => {
            Some(ListCursor::parse(c).ok_or_else(|| ApiError::invalid("cursor is not a cursor this API returned"))?)
        }
        None => None,
    };
    let (records, next) =
        dead_letters::list(&state.store, &filter, cursor, limit, LIST_SCAN_BUDGET).await.map_err(dead_letter_error)?;
    Ok(Json(json!({"data": records, "next_cursor": next.map(|c| c.to_string())})))
}

/// Index entries one listing request looks at, at most.
const LIST_SCAN_BUDGET: usize = 5_000;

fn dead_letter_error(e: dead_letters::SweepError) -> ApiError {
    match e {
        dead_letters::SweepError::Store(e) => ApiError::from(e),
        other => {
            tracing::warn!(error = %other, "dead-letter operation failed");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "broker_unavailable",
                format!("dead-letter operation failed: {other}"),
            )
        }
    }
}

/// Applies `action` to the dead letters `filter` matches (bulk, or one when it names one id).
async fn apply(
    state: &AppState,
    filter: &DeadLetterFilter,
    action: dead_letters::Action,
    limit: Option<u64>,
    per_second: Option<f64>,
) -> Result<dead_letters::SweepReport, ApiError> {
    let publisher = match action {
        dead_letters::Action::Retry => Some(state.broker.publisher()?),
        dead_letters::Action::Delete => None,
    };
    let redrive = publisher
        .as_ref()
        .map(|publisher| dead_letters::Redrive { publisher, topology: &state.config.common.topology });
    dead_letters::apply(&state.store, redrive.as_ref(), filter, action, limit, per_second)
        .await
        .map_err(dead_letter_error)
}

async fn act_on(state: &AppState, id: &str, action: dead_letters::Action) -> Result<dead_letters::Outcome, ApiError> {
    let publisher = match action {
        dead_letters::Action::Retry => Some(state.broker.publisher()?),
        dead_letters::Action::Delete => None,
    };
    let redrive = publisher
        .as_ref()
        .map(|publisher| dead_letters::Redrive { publisher, topology: &state.config.common.topology });
    dead_letters::act_on(&state.store, redrive.as_ref(), id, action).await.map_err(dead_letter_error)
}

fn busy(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "dead_letter_busy",
        format!("dead letter {id:?} is being retried or deleted by another request"),
    )
}

async fn retry_dead_letter(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    match act_on(&state, &id, dead_letters::Action::Retry).await? {
        dead_letters::Outcome::Done => Ok((
            StatusCode::ACCEPTED,
            Json(json!({"data": {"execution_id": id, "status": ExecutionStatus::Queued.as_str()}})),
        )
            .into_response()),
        dead_letters::Outcome::NotReplayable => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_replayable",
            format!("dead letter {id:?} is a poison message: there is no job to retry"),
        )),
        dead_letters::Outcome::Busy => Err(busy(&id)),
        dead_letters::Outcome::NotFound => Err(ApiError::not_found(format!("no dead letter for {id:?}"))),
    }
}

async fn delete_dead_letter(State(state): State<AppState>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    match act_on(&state, &id, dead_letters::Action::Delete).await? {
        dead_letters::Outcome::Done => Ok(StatusCode::NO_CONTENT),
        dead_letters::Outcome::Busy => Err(busy(&id)),
        _ => Err(ApiError::not_found(format!("no dead letter for {id:?}"))),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BulkRequest {
    #[serde(flatten)]
    filter: BulkFilter,
    limit: Option<u64>,
    rate_per_second: Option<f64>,
}

#[derive(Deserialize, Default)]
struct BulkFilter {
    #[serde(default)]
    execution_ids: Vec<String>,
    tool_name: Option<String>,
    reason: Option<DeadLetterReason>,
    since: Option<String>,
    until: Option<String>,
}

fn bulk_request(body: &[u8]) -> Result<(DeadLetterFilter, Option<u64>, Option<f64>), ApiError> {
    let req: BulkRequest = if body.is_empty() { BulkRequest::default() } else { validate::parse_body(body)? };
    let f = req.filter;
    let filter = DeadLetterFilter {
        execution_ids: f.execution_ids,
        tool_name: f.tool_name,
        reason: f.reason,
        since: f.since,
        until: f.until,
    };
    filter.validate().map_err(|field| ApiError::invalid(format!("{field} must be an RFC 3339 timestamp")))?;
    if req.rate_per_second.is_some_and(|r| !(r > 0.0 && r <= 10_000.0)) {
        return Err(ApiError::invalid("rate_per_second must be between 0 and 10000"));
    }
    Ok((filter, req.limit, req.rate_per_second))
}

/// Bulk redrive: every matching dead letter back to the work queue, at a bounded rate (default 50/s).
async fn retry_dead_letters(State(state): State<AppState>, Body(body): Body) -> Result<Json<Value>, ApiError> {
    let (filter, limit, rate) = bulk_request(&body)?;
    let report = apply(&state, &filter, dead_letters::Action::Retry, limit, Some(rate.unwrap_or(50.0))).await?;
    Ok(Json(json!({"data": report})))
}

async fn purge_dead_letters(State(state): State<AppState>, Body(body): Body) -> Result<Json<Value>, ApiError> {
    let (filter, limit, _) = bulk_request(&body)?;
    let report = apply(&state, &filter, dead_letters::Action::Delete, limit, None).await?;
    Ok(Json(json!({"data": report})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_first_publish_that_certainly_did_not_leave_is_not_accepted() {
        use FailureOutcome::*;
        assert_eq!(failure_outcome(None, false), NotAccepted);
        assert_eq!(failure_outcome(Some(PublishFailure::NotSent), false), NotAccepted);
        assert_eq!(failure_outcome(Some(PublishFailure::Unknown), false), Unknown);
        for publish in [None, Some(PublishFailure::NotSent), Some(PublishFailure::Unknown)] {
            assert_eq!(failure_outcome(publish, true), Unknown, "{publish:?}");
        }
    }

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
