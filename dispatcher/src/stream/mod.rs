//! The session's SSE stream, `GET /v1/sessions/{id}/stream` (and a room's, the same stream:
//! `GET /v1/agents/rooms/{room_id}/stream`), and the short-lived stream tokens
//! (`POST …/stream-token`) that let a browser's `EventSource`, which cannot send an
//! `Authorization` header, open it with `?token=`. No other route accepts a token in the query.
//!
//! Events come from one reader per session shared by all its listeners (`hub.rs`), woken by the
//! announcement of each appended event: no stream polls Redis.

mod follow;
mod hub;
mod listener;
mod request;

use std::collections::HashMap;

use axum::extract::{MatchedPath, Path, Request};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, RequestPartsExt};
use serde::Serialize;
use utoipa::ToSchema;

use fleet_platform::now_ms;
use fleet_protocol::stream_token::{self, TOKEN_TTL_MS};
use fleet_protocol::timefmt::rfc3339_from_millis;

use crate::error::ApiError;
use crate::routes::wire::Data;
use crate::{validate, AppState};

pub(crate) use follow::{Awaited, Follow, Window};
pub use hub::StreamHub;
pub(crate) use hub::Subscription;
use listener::Listener;
use request::Start;
pub(crate) use request::StreamId;

/// The routes a stream token opens, as the router names them: a session's stream, and a room's
/// (a room is a session: its id is the session's).
const STREAM_ROUTES: [&str; 2] = ["/v1/sessions/{id}/stream", "/v1/agents/rooms/{room_id}/stream"];
/// What the stream-token key is derived for from `FLEET_SECRETS_KEY`.
const TOKEN_KEY_PURPOSE: &str = "stream-token";

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
    let wanted = request::parse(header, query).map_err(ApiError::malformed)?;
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

/// `POST /v1/sessions/{id}/stream-token`: a token that opens this session's stream (and nothing
/// else) for 60 seconds; a stream opened with it stays open past that.
/// A stream token for the session stored as `session_id` (the caller's tenancy already applied).
pub(crate) fn create_stream_token(state: &AppState, session_id: &str) -> Json<Data<StreamToken>> {
    Data::json(stream_token_for(state, session_id))
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
    let key = state.config.secrets_key.subkey(TOKEN_KEY_PURPOSE);
    StreamToken {
        token: stream_token::sign(&key, session_id, expires_at_ms),
        session_id: fleet_protocol::tenant::session_key_shown(session_id).to_string(),
        expires_at: rfc3339_from_millis(expires_at_ms),
        expires_in: TOKEN_TTL_MS / 1000,
    }
}

/// Authenticates a request that has no `Authorization` header by its `?token=`: only a stream
/// request, only with a valid, unexpired token for that request's session.
pub(crate) async fn admit_by_stream_token(state: &AppState, request: Request) -> Result<Request, ApiError> {
    let on_stream_route =
        request.extensions().get::<MatchedPath>().is_some_and(|p| STREAM_ROUTES.contains(&p.as_str()));
    let token = request.uri().query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == "token").map(|(_, v)| v.into_owned())
    });
    let (Some(token), true) = (token, on_stream_route) else { return Err(ApiError::unauthorized()) };
    let (mut parts, body) = request.into_parts();
    let Path(session_id) = parts.extract::<Path<String>>().await.map_err(|e| ApiError::malformed(e.body_text()))?;
    let key = state.config.secrets_key.subkey(TOKEN_KEY_PURPOSE);
    let tenant = stream_token::verify(&key, &token, &session_id, now_ms())
        .map_err(|e| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", e.to_string()))?;
    // The token was made for this one session, for a caller who could read it then: it decides
    // the tenancy of this request (whose session of that key), which reads nothing else.
    let name = "stream-token".to_string();
    parts.extensions.insert(crate::routes::common::Tenancy { bound: tenant, name });
    Ok(Request::from_parts(parts, body))
}
