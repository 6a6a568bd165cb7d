//! Session routes: `GET /v1/sessions/{id}/messages` (the remembered conversation, the seed's cursor
//! paging) and `DELETE /v1/sessions/{id}` (forget it, its artifacts too).

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use fleet_protocol::history::{page, HistoryEntry, MessageOut, PageRequest};

use crate::error::ApiError;
use crate::routes::common::ApiQuery;
use crate::wire::Data;
use crate::AppState;

/// Newest first unless `order=asc`; `limit` (default 50, at most 100); `cursor` from `next_cursor`.
#[utoipa::path(get, path = "/v1/sessions/{id}/messages", extensions(("x-tenancy" = json!("resource"))), tag = "sessions", security(("bearer" = ["sessions:read"])),
    params(("id" = String, Path, description = "The session id"),
        ("limit" = Option<u32>, Query, description = "1-100 (default 50)"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` from the previous page"),
        ("order" = Option<String>, Query, description = "`desc` (newest first, default) or `asc`"),
        ("tenant" = Option<String>, Query, description = "An operator's token: the tenant whose session of this key (a tenant-bound token's sessions are its tenant's own)")),
    responses((status = 200, description = "The remembered conversation", body = Data<MessagePage>),
        (status = 404, description = "Another tenant's session, asked with a tenant-bound token", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn list_messages(
    State(state): State<AppState>,
    tenancy: crate::tenancy::Tenancy,
    Path(session_id): Path<String>,
    ApiQuery(q): ApiQuery<HashMap<String, String>>,
) -> Result<Json<Data<MessagePage>>, ApiError> {
    let session_id = crate::routes::common::named_session(&tenancy, &session_id, q.get("tenant").map(String::as_str))?;
    crate::routes::common::check_session(&state, &tenancy, &session_id).await?;
    let req = PageRequest::parse(
        q.get("limit").map(String::as_str),
        q.get("cursor").map(String::as_str),
        q.get("order").map(String::as_str),
    )
    .map_err(ApiError::invalid)?;
    let history = state.store.sessions().history(&session_id).await?;
    Ok(Data::json(MessagePage::of(&history, &req)))
}

/// A page of remembered messages (a session's or a room's), the seed's listing shape.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MessagePage {
    pub messages: Vec<MessageOut>,
    pub has_more: bool,
    /// Pass as `cursor` for the next page; null at the end.
    pub next_cursor: Option<String>,
}

impl MessagePage {
    /// The page of `log` that `req` asks for.
    pub(crate) fn of(log: &[HistoryEntry], req: &PageRequest) -> Self {
        let (messages, has_more, next_cursor) = page(log, req);
        Self { messages: messages.into_iter().map(HistoryEntry::to_api).collect(), has_more, next_cursor }
    }
}

/// Forgets the session's conversation and artifacts (204 whether or not it had any); the next turn starts afresh.
#[utoipa::path(delete, path = "/v1/sessions/{id}", extensions(("x-tenancy" = json!("resource"))), tag = "sessions", security(("bearer" = ["sessions:write"])),
    params(("id" = String, Path, description = "The session id"),
        ("tenant" = Option<String>, Query, description = "An operator's token: the tenant whose session of this key")),
    responses((status = 204, description = "Forgotten (whether or not it had a conversation)"),
        (status = 404, description = "Another tenant's session, asked with a tenant-bound token", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn delete_session(
    State(state): State<AppState>,
    caller: Option<axum::Extension<crate::routes::common::Caller>>,
    tenancy: crate::tenancy::Tenancy,
    Path(session_id): Path<String>,
    crate::routes::common::ApiQuery(q): crate::routes::common::ApiQuery<HashMap<String, String>>,
) -> Result<StatusCode, ApiError> {
    let session_id = crate::routes::common::named_session(&tenancy, &session_id, q.get("tenant").map(String::as_str))?;
    crate::routes::common::check_session(&state, &tenancy, &session_id).await?;
    forget(&state, &session_id).await?;
    crate::routes::audit::record_api(&state, caller.as_deref(), "session.forget", &session_id, 1, None).await;
    Ok(StatusCode::NO_CONTENT)
}

/// Forgets the session's conversation and its artifacts: the history, then the artifacts'
/// records (so none is served from then on), then their files, listed by the session's prefix (so
/// a file whose record was never written goes too). A failure leaves what is left for the same
/// request again.
pub(crate) async fn forget(state: &AppState, session_id: &str) -> Result<(), ApiError> {
    state.store.sessions().history_delete(session_id).await?;
    state.store.sessions().artifacts_delete(session_id).await?;
    let store = &state.config.common.artifacts;
    store.delete_session(session_id).await.map_err(crate::routes::artifacts::unavailable)?;
    Ok(())
}

/// This module's routes, each with its OpenAPI operation (path, method, scope): adding a route
/// here is all it takes to serve, document and guard it.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(list_messages))
        .routes(utoipa_axum::routes!(delete_session))
}
