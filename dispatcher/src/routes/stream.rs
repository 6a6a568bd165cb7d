//! `GET /v1/sessions/{id}/stream` and `POST /v1/sessions/{id}/stream-token`: a session's events as
//! server-sent events (served by `crate::stream`: one reader per session, shared by its listeners),
//! and the short-lived token a browser's `EventSource` opens it with.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Json;

use axum::http::{header, HeaderValue};
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa::ToSchema;

use fleet_platform::now_ms;
use fleet_protocol::stream_token::{self, TOKEN_TTL_MS};
use fleet_protocol::timefmt::rfc3339_from_millis;

use crate::error::ApiError;
use crate::stream::{Listener, Start, StreamId};
use crate::validate;
use crate::wire::Data;
use crate::AppState;

/// The session's events as SSE in the seed's wire format, from `Last-Event-ID` (or
/// `?last_event_id=`), from the retained window's start (`?since=start`) or from now; `?until=done`
/// ends the response after the next `done`; `?token=` (a stream token) instead of a bearer token.
#[utoipa::path(get, path = "/v1/sessions/{id}/stream", extensions(("x-tenancy" = json!("resource"))), tag = "sessions", security(("bearer" = ["sessions:read"])),
    params(("id" = String, Path, description = "The session id"),
        ("tenant" = Option<String>, Query, description = "An operator's token: the tenant whose session of this key"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event (an id this stream sent)"),
        ("last_event_id" = Option<String>, Query, description = "Like the Last-Event-ID header (the header wins)"),
        ("since" = Option<String>, Query, description = "`start`: replay the retained window; `now` (default): new events only"),
        ("until" = Option<String>, Query, description = "`done`: close the stream after the next `done` event"),
        ("token" = Option<String>, Query, description = "A stream token from POST /v1/sessions/{id}/stream-token (for EventSource)")),
    responses((status = 200, description = "The session's events as server-sent events", content_type = "text/event-stream", body = String),
        (status = 404, description = "Another tenant's session, asked with a tenant-bound token", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn stream_session(
    State(state): State<AppState>,
    tenancy: crate::tenancy::Tenancy,
    Path(session_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let stored = crate::routes::common::named_session(&tenancy, &session_id, query.get("tenant").map(String::as_str))?;
    crate::routes::common::check_session(&state, &tenancy, &stored).await?;
    serve(&state, stored, &headers, &query).await
}

/// A token that opens this session's stream (and nothing else) for 60 seconds, for a browser's
/// `EventSource`, which cannot send headers.
#[utoipa::path(post, path = "/v1/sessions/{id}/stream-token", extensions(("x-tenancy" = json!("resource"))), tag = "sessions", security(("bearer" = ["sessions:read"])),
    params(("id" = String, Path, description = "The session id"),
        ("tenant" = Option<String>, Query, description = "An operator's token: the tenant whose session of this key")),
    responses((status = 200, description = "The stream token", body = Data<StreamToken>),
        (status = 404, description = "Another tenant's session, asked with a tenant-bound token", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn create_stream_token(
    State(state): State<AppState>,
    tenancy: crate::tenancy::Tenancy,
    Path(session_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Data<StreamToken>>, ApiError> {
    let stored = crate::routes::common::named_session(&tenancy, &session_id, query.get("tenant").map(String::as_str))?;
    crate::routes::common::check_session(&state, &tenancy, &stored).await?;
    Ok(Data::json(stream_token_for(&state, &stored)))
}

/// `GET /v1/sessions/{id}/stream`: the session's events as SSE in the seed's wire format, from
/// `Last-Event-ID` / `?last_event_id=` (within the retained window), from the window's start
/// (`?since=start`) or from now; `?until=done` ends it after the next `done` event.
pub(crate) async fn serve(
    state: &AppState,
    session_id: String,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    validate::identifier("session id", Some(fleet_protocol::tenant::session_key_shown(&session_id)))?;
    let header = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(v.to_str().map_err(|_| ApiError::malformed("Last-Event-ID is not text"))?),
    };
    let wanted = crate::stream::parse_request(header, query).map_err(ApiError::malformed)?;
    let subscription = state.streams.join(&session_id).await?;
    let after = match wanted.start {
        Start::After(id) => id,
        Start::Beginning => StreamId::ZERO,
        Start::Now => {
            StreamId::parse(&state.store.sessions().last_event_id(&session_id).await?).unwrap_or(StreamId::ZERO)
        }
    };
    let listener = Listener::new(state.streams.clone(), session_id, subscription, after, wanted.until_done);
    Ok((
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            // Proxies that buffer responses (nginx) would hold the events back.
            (header::HeaderName::from_static("x-accel-buffering"), HeaderValue::from_static("no")),
            // A page on another origin reads the stream with a token: the token is the credential,
            // no cookie is involved, so any origin may.
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*")),
        ],
        listener.into_body(),
    )
        .into_response())
}

/// A stream token: `token` opens the session's stream with `?token=` until `expires_at`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StreamToken {
    pub token: String,
    pub session_id: String,
    /// RFC 3339.
    pub expires_at: String,
    /// Seconds it stays valid (60).
    #[schema(minimum = 0)]
    pub expires_in: i64,
}

/// A new stream token for `session_id`'s stream.
pub(crate) fn stream_token_for(state: &AppState, session_id: &str) -> StreamToken {
    let expires_at_ms = now_ms() + TOKEN_TTL_MS;
    let key = state.config.secrets_key.subkey(crate::routes::common::TOKEN_KEY_PURPOSE);
    StreamToken {
        token: stream_token::sign(&key, session_id, expires_at_ms),
        session_id: fleet_protocol::tenant::session_key_shown(session_id).to_string(),
        expires_at: rfc3339_from_millis(expires_at_ms),
        expires_in: TOKEN_TTL_MS / 1000,
    }
}

/// This module's routes, each with its OpenAPI operation (path, method, scope): adding a route
/// here is all it takes to serve, document and guard it.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(stream_session))
        .routes(utoipa_axum::routes!(create_stream_token))
}
