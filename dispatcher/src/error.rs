//! API errors: `{"error":{"code","message"}}` with the SPEC's status codes; messages name the problem.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use fleet_platform::broker::BrokerError;
use fleet_platform::store::StoreError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// The execution the error is about, when the client needs it to follow up.
    pub execution_id: Option<String>,
    /// The scope the token lacks (403 `insufficient_scope`).
    pub required_scope: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into(), execution_id: None, required_scope: None }
    }
    /// A publish whose confirm never came: the job may run, and a retry with the same
    /// `Idempotency-Key` returns this execution rather than making another.
    pub fn outcome_unknown(execution_id: &str, why: &str) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "outcome_unknown",
            format!(
                "the broker did not confirm the job ({why}): the job may or may not have been accepted; \
                 retry with the same Idempotency-Key, or look up execution {execution_id}"
            ),
        );
        e.execution_id = Some(execution_id.to_string());
        e
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
    /// A valid token without the scope the route requires.
    pub fn insufficient_scope(scope: &'static str, method: &str, route: &str) -> Self {
        let mut e = Self::new(
            StatusCode::FORBIDDEN,
            "insufficient_scope",
            format!("this token lacks the scope {scope:?}, which {method} {route} requires"),
        );
        e.required_scope = Some(scope);
        e
    }
    /// The operator's configuration or log, asked for with a tenant-bound token: refused whatever
    /// it is about, so it says nothing about any tenant's things.
    pub fn operator_only(method: &str, route: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "operator_only",
            format!("{method} {route} is the operator's: a tenant-bound token may not use it"),
        )
    }
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid 'Authorization: Bearer <token>' header is required",
        )
    }
}

/// Every error: `{"error": {"code", "message"}}`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorDetail {
    /// A stable machine-readable code, e.g. `invalid_request`, `insufficient_scope`.
    code: &'static str,
    /// What is wrong, naming the field or setting.
    message: String,
    /// The execution the error is about (`outcome_unknown`).
    #[serde(skip_serializing_if = "Option::is_none")]
    execution_id: Option<String>,
    /// The scope the token lacks (`insufficient_scope`).
    #[serde(skip_serializing_if = "Option::is_none")]
    required_scope: Option<&'static str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let error = ErrorDetail {
            code: self.code,
            message: self.message,
            execution_id: self.execution_id,
            required_scope: self.required_scope,
        };
        let mut response = (self.status, Json(ErrorBody { error })).into_response();
        if let Some(scope) = self.required_scope {
            // RFC 6750's challenge, for clients that read the header rather than the body.
            let challenge = format!("Bearer error=\"insufficient_scope\", scope=\"{scope}\"");
            if let Ok(value) = axum::http::HeaderValue::from_str(&challenge) {
                response.headers_mut().insert(axum::http::header::WWW_AUTHENTICATE, value);
            }
        }
        response
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
