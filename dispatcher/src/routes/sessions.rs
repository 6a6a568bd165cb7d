//! Session routes: `GET /v1/sessions/{id}/messages` (the remembered conversation, the seed's cursor
//! paging) and `DELETE /v1/sessions/{id}` (forget it).

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use fleet_protocol::history::{page, HistoryEntry, PageRequest};

use crate::error::ApiError;
use crate::routes::common::ApiQuery;
use crate::{validate, AppState};

/// Newest first unless `order=asc`; `limit` (default 50, at most 100); `cursor` from `next_cursor`.
#[utoipa::path(get, path = "/v1/sessions/{id}/messages", tag = "sessions", security(("bearer" = ["sessions:read"])),
    params(("id" = String, Path, description = "The session id"),
        ("limit" = Option<u32>, Query, description = "1-100 (default 50)"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` from the previous page"),
        ("order" = Option<String>, Query, description = "`desc` (newest first, default) or `asc`")),
    responses((status = 200, description = "The remembered conversation", body = crate::routes::docs::MessagesResponse), crate::routes::docs::CommonErrors))]
pub(crate) async fn list_messages(
    State(state): State<AppState>,
    Path(session_id): Path<String>,
    ApiQuery(q): ApiQuery<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    validate::identifier("session id", Some(&session_id))?;
    let req = PageRequest::parse(
        q.get("limit").map(String::as_str),
        q.get("cursor").map(String::as_str),
        q.get("order").map(String::as_str),
    )
    .map_err(ApiError::invalid)?;
    let history = state.store.history(&session_id).await?;
    let (messages, has_more, next_cursor) = page(&history, &req);
    let messages: Vec<Value> = messages.into_iter().map(HistoryEntry::to_api).collect();
    Ok(Json(json!({"data": {"messages": messages, "has_more": has_more, "next_cursor": next_cursor}})))
}

/// Forgets the session's conversation (204 whether or not it had one); the next turn starts afresh.
#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions", security(("bearer" = ["sessions:write"])),
    params(("id" = String, Path, description = "The session id")),
    responses((status = 204, description = "Forgotten (whether or not it had a conversation)"), crate::routes::docs::CommonErrors))]
pub(crate) async fn delete_session(
    State(state): State<AppState>,
    Path(session_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    validate::identifier("session id", Some(&session_id))?;
    state.store.history_delete(&session_id).await?;
    Ok(StatusCode::NO_CONTENT)
}
