//! Agent-turn routes: `POST /v1/turns` and the session's SSE stream.

use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use fleet_platform::store::NewExecution;
use fleet_platform::{now_ms, telemetry};
use fleet_protocol::envelope::{Envelope, Job, JobKind, TurnJob};
use fleet_protocol::turn::{self, TurnInput, TurnState};

use crate::api::{require_json, Body};
use crate::error::ApiError;
use crate::{validate, AppState};

/// Records the turn, puts it in its session's line (arrival order is run order), and publishes its
/// first step with a publisher confirm before answering 202.
pub(crate) async fn create_turn(
    State(state): State<AppState>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Response, ApiError> {
    require_json(&headers)?;
    let input: TurnInput = validate::parse_body(&body)?;
    input.validate().map_err(ApiError::invalid)?;
    let execution_id = fleet_protocol::new_execution_id();
    let message_id = fleet_protocol::turn::attempt_message_id(&execution_id, 0, 1);
    let span =
        tracing::info_span!("turn", otel.name = "POST /v1/turns", otel.kind = "server", execution_id = %execution_id);
    let _ = span.set_parent(telemetry::from_http_headers(&headers));
    async {
        let publisher = state.broker.publisher()?;
        let turn = TurnState::new(&input, message_id);
        state.store.save_turn(&execution_id, &turn).await?;
        state
            .store
            .create_execution(&NewExecution {
                execution_id: &execution_id,
                kind: JobKind::Turn.as_str(),
                tool_name: None,
                room_id: Some(&input.session_id),
                assistant_id: Some(&input.assistant.id),
                now_ms: now_ms(),
            })
            .await?;
        state.store.session_enqueue(&input.session_id, &execution_id).await?;
        let envelope = Envelope::new(
            execution_id.clone(),
            Job::Turn(TurnJob { session_id: input.session_id.clone(), round: 0 }),
            now_ms(),
        );
        let headers = telemetry::amqp_headers(&tracing::Span::current());
        if let Err(e) = publisher.publish_job(&state.config.common.topology, &envelope, headers).await {
            let _ = state.store.session_dequeue(&input.session_id, &execution_id).await;
            let _ = state.store.delete_execution(&execution_id, JobKind::Turn.as_str()).await;
            return Err(ApiError::from(e));
        }
        state.metrics.jobs_published.with_label_values(&[JobKind::Turn.as_str()]).inc();
        Ok::<_, ApiError>(())
    }
    .instrument(span)
    .await?;
    Ok((StatusCode::ACCEPTED, Json(json!({"data": {"execution_id": execution_id, "status": "queued"}})))
        .into_response())
}

/// The turn's part of `GET /v1/executions/{id}`: rounds, tool calls, final message.
pub(crate) async fn turn_summary(state: &AppState, execution_id: &str) -> Result<Option<Value>, ApiError> {
    Ok(state.store.load_turn(execution_id).await?.map(|t| {
        json!({
            "session_id": t.session_id,
            "message_id": t.message_id,
            "rounds": t.round,
            "tool_calls": t.tool_calls,
            "final_message": t.final_message,
            "usage": t.usage,
        })
    }))
}

/// `GET /v1/sessions/{id}/stream`: the session's events as SSE in the seed's wire format, from
/// `Last-Event-ID` (within the retained window) or from now.
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
