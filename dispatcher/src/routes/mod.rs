//! The HTTP API's routes, one module per resource, and the router that joins them (with the
//! bearer-token check and request metrics around every route).

pub(crate) mod common;
pub(crate) mod dead_letters;
pub(crate) mod executions;
pub(crate) mod sessions;
pub(crate) mod stream;
pub(crate) mod submit;
pub(crate) mod tool_calls;
pub(crate) mod tools;
pub(crate) mod turns;
pub(crate) mod webhooks;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post, put};
use axum::Router;

use crate::error::ApiError;
use crate::AppState;

pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/tools", get(tools::list_tools).post(tools::post_tool))
        .route("/v1/tools/{tool}", put(tools::put_tool).get(tools::get_tool).delete(tools::delete_tool))
        .route("/v1/tool-calls", post(tool_calls::create_tool_call))
        .route("/v1/turns", post(turns::create_turn))
        .route("/v1/sessions/{id}/stream", get(stream::stream_session))
        .route("/v1/sessions/{id}/messages", get(sessions::list_messages))
        .route("/v1/sessions/{id}", axum::routing::delete(sessions::delete_session))
        .route("/v1/webhooks", get(webhooks::list_webhooks))
        .route(
            "/v1/webhooks/{id}",
            put(webhooks::put_webhook).get(webhooks::get_webhook).delete(webhooks::delete_webhook),
        )
        .route("/v1/executions/{id}", get(executions::get_execution))
        .route("/v1/dead-letters", get(dead_letters::list_dead_letters))
        .route("/v1/dead-letters/retry", post(dead_letters::retry_dead_letters))
        .route("/v1/dead-letters/purge", post(dead_letters::purge_dead_letters))
        .route("/v1/dead-letters/{id}", get(dead_letters::get_dead_letter).delete(dead_letters::delete_dead_letter))
        .route("/v1/dead-letters/{id}/retry", post(dead_letters::retry_dead_letter))
        .route_layer(middleware::from_fn_with_state(state.clone(), common::require_token))
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
