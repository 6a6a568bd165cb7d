//! `GET /v1/sessions/{id}/stream`: a session's events as server-sent events.

use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use fleet_protocol::turn;

use crate::error::ApiError;
use crate::{validate, AppState};

/// `GET /v1/sessions/{id}/stream`: the session's events as SSE in the seed's wire format, from
/// `Last-Event-ID` (within the retained window) or from now.
#[utoipa::path(get, path = "/v1/sessions/{id}/stream", tag = "sessions", security(("bearer" = ["sessions:read"])),
    params(("id" = String, Path, description = "The session id"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event (an id this stream sent)")),
    responses((status = 200, description = "The session's events as server-sent events", content_type = "text/event-stream", body = String),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn stream_session(
    State(state): State<AppState>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    validate::identifier("session id", Some(&session_id))?;
    let start = match headers.get("last-event-id").and_then(|v| v.to_str().ok()) {
        Some(id) if is_stream_id(id) => id.to_string(),
        Some(_) => return Err(ApiError::malformed("Last-Event-ID is not an event id this stream sent")),
        None => state.store.last_event_id(&session_id).await?,
    };
    let store = state.store.clone();
    let events = futures::stream::unfold(
        (store, session_id, start, Instant::now()),
        |(store, sid, after, mut beat)| async move {
            loop {
                match store.read_events(&sid, &after).await {
                    Ok(batch) if !batch.is_empty() => {
                        let last = batch.last().map(|(id, _)| id.clone()).unwrap_or_else(|| after.clone());
                        let text: String = batch
                            .iter()
                            .filter_map(|(id, data)| {
                                serde_json::from_str::<Value>(data).ok().map(|e| turn::sse_frame(id, &e))
                            })
                            .collect();
                        return Some((
                            Ok::<_, std::io::Error>(bytes::Bytes::from(text)),
                            (store, sid, last, Instant::now()),
                        ));
                    }
                    _ => {
                        if beat.elapsed() > Duration::from_secs(15) {
                            beat = Instant::now();
                            return Some((
                                Ok(bytes::Bytes::from_static(b": keep-alive\n\n")),
                                (store, sid, after, beat),
                            ));
                        }
                        // Polled, not blocked: the Redis connection is shared with every other request.
                        tokio::time::sleep(Duration::from_millis(25)).await;
                    }
                }
            }
        },
    );
    Ok((
        [(axum::http::header::CONTENT_TYPE, "text/event-stream"), (axum::http::header::CACHE_CONTROL, "no-cache")],
        axum::body::Body::from_stream(events),
    )
        .into_response())
}

fn is_stream_id(id: &str) -> bool {
    let mut parts = id.split('-');
    let digits = |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()));
    digits(parts.next()) && digits(parts.next()) && parts.next().is_none()
}

#[cfg(test)]
mod tests {
    #[test]
    fn stream_ids_are_redis_ids() {
        assert!(super::is_stream_id("1700000000000-0"));
        assert!(!super::is_stream_id("abc"));
        assert!(!super::is_stream_id("1-2-3"));
        assert!(!super::is_stream_id("1-"));
    }
}
