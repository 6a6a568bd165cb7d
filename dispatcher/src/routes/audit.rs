//! `GET /v1/audit`: the operators' audit log, newest first; and the one place routes write to it.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use fleet_platform::store::{AuditEntry, AuditEvent};
use fleet_protocol::timefmt::rfc3339_from_millis;

use crate::error::ApiError;
use crate::routes::common::{page_limit, ApiQuery, Caller};
use crate::wire::Listed;
use crate::AppState;

/// Who a request's token is, as the audit log names it (a digest prefix, never the token).
pub(crate) fn actor(caller: Option<&Caller>) -> String {
    match caller {
        Some(Caller(digest)) => format!("token:{}", &digest[..digest.len().min(12)]),
        None => "unknown".to_string(),
    }
}

/// Writes one change to the audit log. The change is made already: a failed write is logged (and
/// counted as a Redis error), not the change's failure.
pub(crate) async fn record(state: &AppState, event: AuditEvent<'_>) {
    if let Err(error) = state.store.audit().record(&event).await {
        tracing::error!(action = event.action, target = event.target, %error, "cannot write the audit log");
    }
}

/// Writes a change made through the API to the audit log, as the caller's.
pub(crate) async fn record_api(
    state: &AppState,
    caller: Option<&Caller>,
    action: &str,
    target: &str,
    count: u64,
    detail: Option<&Value>,
) {
    let actor = actor(caller);
    record(state, AuditEvent { actor: &actor, via: "api", action, target, count, detail }).await;
}

/// One change an operator made, as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AuditEntry)]
pub(crate) struct AuditEntryOut {
    /// A cursor (the log's stream id).
    id: String,
    /// RFC 3339.
    at: String,
    /// `token:<digest prefix>` (never the token), or `fleetctl:<user>`.
    actor: String,
    /// `api`, `console` or `fleetctl`.
    via: String,
    /// `dead_letter.retry`, `dead_letter.retry_edited`, `dead_letter.delete`, `dead_letters.redrive`,
    /// `dead_letters.purge`, `execution.cancel`, `circuit.close`, `session.forget`, `approval.approve`
    /// or `approval.deny`.
    action: String,
    /// An id, a tool, a session, or a bulk operation's filter.
    target: String,
    /// How many it changed.
    count: u64,
    detail: Option<Value>,
}

impl From<&AuditEntry> for AuditEntryOut {
    fn from(e: &AuditEntry) -> Self {
        Self {
            id: e.id.clone(),
            at: rfc3339_from_millis(e.at_ms),
            actor: e.actor.clone(),
            via: e.via.clone(),
            action: e.action.clone(),
            target: e.target.clone(),
            count: e.count,
            detail: e.detail.clone(),
        }
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct AuditQuery {
    /// `next_cursor` from the previous page.
    cursor: Option<String>,
    /// 1-200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<usize>,
}

/// Every change made through the operator routes, the console or `fleetctl` (dead-letter retries,
/// redrives and purges, cancels, circuit closes, session forgets): who, when, what, how many.
/// Newest first; the log keeps the latest 100,000 entries.
#[utoipa::path(get, path = "/v1/audit", extensions(("x-tenancy" = json!("operator"))), tag = "audit", security(("bearer" = ["audit:read", "operator"])),
    params(AuditQuery),
    responses((status = 200, description = "Audit entries, newest first", body = Listed<AuditEntryOut>), crate::routes::docs::CommonErrors))]
pub(crate) async fn list_audit(
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> Result<Json<Listed<AuditEntryOut>>, ApiError> {
    let limit = page_limit(q.limit)?;
    if q.cursor.as_deref().is_some_and(|c| !fleet_platform::store::is_cursor(c)) {
        return Err(ApiError::invalid("cursor is not a cursor this API returned"));
    }
    let (entries, next) = state.store.audit().audit_page(q.cursor.as_deref(), limit).await?;
    Ok(Listed::json(entries.iter().map(AuditEntryOut::from).collect(), next))
}

/// This module's routes, each with its OpenAPI operation (path, method, scope): adding a route
/// here is all it takes to serve, document and guard it.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new().routes(utoipa_axum::routes!(list_audit))
}
