//! `GET /v1/sessions/{id}/stream` and `POST /v1/sessions/{id}/stream-token`: a session's events as
//! server-sent events (served by `crate::stream`: one reader per session, shared by its listeners),
//! and the short-lived token a browser's `EventSource` opens it with.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Json;

use crate::error::ApiError;
use crate::routes::wire::Data;
use crate::stream::StreamToken;
use crate::AppState;

/// The session's events as SSE in the seed's wire format, from `Last-Event-ID` (or
/// `?last_event_id=`), from the retained window's start (`?since=start`) or from now; `?until=done`
/// ends the response after the next `done`; `?token=` (a stream token) instead of a bearer token.
#[utoipa::path(get, path = "/v1/sessions/{id}/stream", tag = "sessions", security(("bearer" = ["sessions:read"])),
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
    tenancy: crate::routes::common::Tenancy,
    Path(session_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let stored = crate::routes::common::named_session(&tenancy, &session_id, query.get("tenant").map(String::as_str))?;
    crate::routes::common::check_session(&state, &tenancy, &stored).await?;
    crate::stream::serve(&state, stored, &headers, &query).await
}

/// A token that opens this session's stream (and nothing else) for 60 seconds, for a browser's
/// `EventSource`, which cannot send headers.
#[utoipa::path(post, path = "/v1/sessions/{id}/stream-token", tag = "sessions", security(("bearer" = ["sessions:read"])),
    params(("id" = String, Path, description = "The session id"),
        ("tenant" = Option<String>, Query, description = "An operator's token: the tenant whose session of this key")),
    responses((status = 200, description = "The stream token", body = Data<StreamToken>),
        (status = 404, description = "Another tenant's session, asked with a tenant-bound token", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn create_stream_token(
    State(state): State<AppState>,
    tenancy: crate::routes::common::Tenancy,
    Path(session_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Data<StreamToken>>, ApiError> {
    let stored = crate::routes::common::named_session(&tenancy, &session_id, query.get("tenant").map(String::as_str))?;
    crate::routes::common::check_session(&state, &tenancy, &stored).await?;
    Ok(crate::stream::create_stream_token(&state, &stored))
}
