//! API errors: `{"error":{"code","message"}}` with the SPEC's status codes; messages name the problem.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use fleet_platform::broker::BrokerError;
use fleet_platform::store::StoreError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "malformed_request", message)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid 'Authorization: Bearer <token>' header is required",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": {"code": self.code, "message": self.message}}))).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        tracing::warn!(error = %e, "redis operation failed");
        match e {
            StoreError::Redis(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "redis_unavailable",
                "the state store (Redis) is unavailable; nothing was accepted, try again",
            ),
            StoreError::Corrupt(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "a stored record could not be read")
            }
        }
    }
}

impl From<BrokerError> for ApiError {
    fn from(e: BrokerError) -> Self {
        tracing::warn!(error = %e, "publish failed");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "broker_unavailable",
            format!("the job was not accepted: {e}; try again"),
        )
    }
}
