//! The envelopes every answer comes in, `{"data": T}` and a list's page `{"data": [T],
//! "next_cursor": …}`: serialised by serde and documented by the same types, so a handler's
//! answer and its schema cannot drift.

use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

/// `{"data": T}`: how every answer with a body is wrapped.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Data<T> {
    pub data: T,
}

impl<T> Data<T> {
    /// `data` wrapped, as a JSON answer.
    pub(crate) fn json(data: T) -> Json<Self> {
        Json(Self { data })
    }
}

/// A page of a list: the entries and where the next page starts.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Listed<T> {
    pub data: Vec<T>,
    /// Pass as `cursor` for the next page; null only at the end (a page may be short, even empty,
    /// with a cursor).
    pub next_cursor: Option<String>,
}

impl<T> Listed<T> {
    /// A page of `data`, as a JSON answer.
    pub(crate) fn json(data: Vec<T>, next_cursor: Option<String>) -> Json<Self> {
        Json(Self { data, next_cursor })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::error::ApiError;
    use crate::routes::executions::CancelAnswer;
    use crate::routes::submit::AcceptedJob;
    use fleet_protocol::execution::ExecutionStatus;

    fn answer<T: Serialize>(value: T) -> serde_json::Value {
        serde_json::to_value(value).unwrap()
    }

    /// The typed answers say what the hand-built JSON before them said: absent fields stay absent.
    #[test]
    fn answers_keep_their_shape_and_leave_out_what_is_not_said() {
        let accepted = AcceptedJob::new("exec_1".into(), ExecutionStatus::Queued);
        assert_eq!(answer(Data { data: accepted }), json!({"data": {"execution_id": "exec_1", "status": "queued"}}));
        let noted = AcceptedJob { note: Some("n"), ..AcceptedJob::new("exec_1".into(), ExecutionStatus::Succeeded) };
        assert_eq!(answer(noted)["note"], "n");
        let cancelled = CancelAnswer { execution_id: "exec_2".into(), status: ExecutionStatus::Cancelled, note: None };
        assert_eq!(answer(cancelled), json!({"execution_id": "exec_2", "status": "cancelled"}));
        let page: Listed<u8> = Listed { data: vec![], next_cursor: None };
        assert_eq!(answer(page), json!({"data": [], "next_cursor": null}));
    }

    #[test]
    fn an_error_names_its_execution_or_scope_only_when_it_has_one() {
        let body = |e: ApiError| {
            let response = axum::response::IntoResponse::into_response(e);
            let bytes = futures::executor::block_on(axum::body::to_bytes(response.into_body(), 4096)).unwrap();
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()
        };
        assert_eq!(body(ApiError::invalid("x")), json!({"error": {"code": "invalid_request", "message": "x"}}));
        let scoped = body(ApiError::insufficient_scope("tools:read", "GET", "/v1/tools"));
        assert_eq!(scoped["error"]["required_scope"], "tools:read");
        assert!(scoped["error"].get("execution_id").is_none());
    }
}
