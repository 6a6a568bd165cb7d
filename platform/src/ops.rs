//! The operational HTTP surface every process shares: `/healthz`, `/readyz`, `/metrics`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Answers whether the process can do its work now; `Err` names what is missing.
pub type ReadinessCheck = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

#[derive(Clone)]
struct OpsState {
    metrics: Metrics,
    ready: ReadinessCheck,
}

/// A router with the three operational routes.
pub fn router(metrics: Metrics, ready: ReadinessCheck) -> Router {
    Router::new()
        .route("/healthz", get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(OpsState { metrics, ready })
}

async fn readyz(State(state): State<OpsState>) -> Response {
    match (state.ready)().await {
        Ok(()) => axum::Json(serde_json::json!({"status": "ready"})).into_response(),
        Err(why) => {
            (StatusCode::SERVICE_UNAVAILABLE, axum::Json(serde_json::json!({"status": "not_ready", "reason": why})))
                .into_response()
        }
    }
}

async fn metrics_text(State(state): State<OpsState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render()).into_response()
}

/// Binds `addr` (failing with a clear error if it cannot) and serves `app` until `cancel` fires.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

pub async fn serve(listener: tokio::net::TcpListener, app: Router, cancel: CancellationToken) -> std::io::Result<()> {
    axum::serve(listener, app).with_graceful_shutdown(async move { cancel.cancelled().await }).await
}
