//! `/v1/approvals`: calls that wait for an operator's decision (a tool with `requires_approval`),
//! listed, read and decided. A decision is taken once (a write conditional on `pending`), audited,
//! and publishes the call's job at once: the job's gate then runs the call, or reports the denial
//! to its turn. The same decision again answers as it stands (and publishes the job again, a copy
//! its claim acks); a different one is a 409.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;

use fleet_platform::now_ms;
use fleet_platform::store::{DecideWrite, StoredApproval};
use fleet_protocol::approvals::{self, Approval, ApprovalDecision, ApprovalStatus, Decided, DecisionVerdict};
use fleet_protocol::envelope::Envelope;
use fleet_protocol::timefmt::rfc3339_from_millis;

use crate::error::ApiError;
use crate::routes::common::{page_limit, ApiQuery, Caller, JsonInput, Tenancy};
use crate::routes::submit::{publish, EnqueueFailure};
use crate::wire::{Data, Listed};
use crate::AppState;

/// The longest a decision's reason may be.
const MAX_REASON_CHARS: usize = 512;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ApprovalsQuery {
    /// Only approvals in this status (`pending`: those waiting for a decision).
    status: Option<ApprovalStatus>,
    /// 1-200 (default 50), newest first.
    limit: Option<usize>,
}

/// An operator's decision on a call.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DecisionInput {
    decision: ApprovalDecision,
    /// Why (at most 512 characters). A denial's reason is the model's error message, if it is safe
    /// to show (no credential, path or URL); otherwise a fixed one is.
    reason: Option<String>,
}

/// Calls waiting for (or settled by) a decision, newest first: the caller's tenant's, or every
/// tenant's for an operator's token.
#[utoipa::path(get, path = "/v1/approvals", extensions(("x-tenancy" = json!("listing"))), tag = "approvals", security(("bearer" = ["executions:read"])),
    params(ApprovalsQuery),
    responses((status = 200, description = "Approvals", body = Listed<Approval>), crate::routes::docs::CommonErrors))]
pub(crate) async fn list_approvals(
    State(state): State<AppState>,
    tenancy: Tenancy,
    ApiQuery(q): ApiQuery<ApprovalsQuery>,
) -> Result<Json<Listed<Approval>>, ApiError> {
    let limit = page_limit(q.limit)?;
    let found = state.store.approvals().list(tenancy.bound.as_deref(), q.status, limit).await?;
    Ok(Listed::json(found.into_iter().map(|a| shown(&tenancy, a)).collect(), None))
}

#[utoipa::path(get, path = "/v1/approvals/{id}", extensions(("x-tenancy" = json!("resource"))), tag = "approvals", security(("bearer" = ["executions:read"])),
    params(("id" = String, Path, description = "The approval's id (`approval_request`'s `approval_id`)")),
    responses((status = 200, description = "The approval", body = Data<Approval>),
        (status = 404, description = "No such approval", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn get_approval(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path(id): Path<String>,
) -> Result<Json<Data<Approval>>, ApiError> {
    let stored = find(&state, &tenancy, &id).await?;
    Ok(Data::json(shown(&tenancy, stored.approval)))
}

/// Approves or denies a call. Approved, the call runs as it would have; denied, the model gets a
/// `failed` result with code `APPROVAL_DENIED` and the reason, and the turn goes on.
#[utoipa::path(post, path = "/v1/approvals/{id}", extensions(("x-tenancy" = json!("resource"))), tag = "approvals", security(("bearer" = ["executions:write"])),
    params(("id" = String, Path, description = "The approval's id")),
    request_body(content = DecisionInput, description = "The decision"),
    responses((status = 200, description = "Decided (or decided so already)", body = Data<Approval>),
        (status = 404, description = "No such approval", body = crate::routes::docs::ErrorBody),
        (status = 409, description = "Decided otherwise already, or by its deadline (`approval_decided`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn decide_approval(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    tenancy: Tenancy,
    Path(id): Path<String>,
    JsonInput { value: input, .. }: JsonInput<DecisionInput>,
) -> Result<Json<Data<Approval>>, ApiError> {
    let actor = crate::routes::audit::actor(caller.as_deref());
    let decided = decide(&state, &tenancy, &id, input.decision, input.reason, (&actor, "api")).await?;
    Ok(Data::json(decided))
}

/// Takes `decision` on approval `id` as `by` (actor, via): see `decide_approval`. Shared with the
/// console.
pub(crate) async fn decide(
    state: &AppState,
    tenancy: &Tenancy,
    id: &str,
    decision: ApprovalDecision,
    reason: Option<String>,
    by: (&str, &str),
) -> Result<Approval, ApiError> {
    let reason = reason.map(|r| r.trim().to_string()).filter(|r| !r.is_empty());
    if reason.as_ref().is_some_and(|r| r.chars().count() > MAX_REASON_CHARS) {
        return Err(ApiError::invalid(format!("reason is longer than {MAX_REASON_CHARS} characters")));
    }
    let stored = find(state, tenancy, id).await?;
    let verdict = approvals::judge_decision(stored.approval.status, decision);
    let verdict = match verdict {
        DecisionVerdict::Take => {
            let decided = Decided { by: by.0.to_string(), at: rfc3339_from_millis(now_ms()), reason: reason.clone() };
            match state.store.approvals().decide(id, decision.status(), &decided).await? {
                DecideWrite::Taken => {
                    audit(state, by, id, decision, &stored, reason.as_deref()).await;
                    DecisionVerdict::Take
                }
                DecideWrite::Already(now) => approvals::judge_decision(now, decision),
                DecideWrite::Missing => return Err(no_approval(id)),
            }
        }
        other => other,
    };
    if verdict == DecisionVerdict::Conflict {
        let now = state.store.approvals().get(id).await?.map_or(stored.approval.status, |s| s.approval.status);
        return Err(conflict(id, now));
    }
    release(state, &stored).await?;
    let now = state.store.approvals().get(id).await?.ok_or_else(|| no_approval(id))?;
    Ok(shown(tenancy, now.approval))
}

async fn audit(
    state: &AppState,
    by: (&str, &str),
    id: &str,
    decision: ApprovalDecision,
    stored: &StoredApproval,
    reason: Option<&str>,
) {
    let action = match decision {
        ApprovalDecision::Approve => "approval.approve",
        ApprovalDecision::Deny => "approval.deny",
    };
    let a = &stored.approval;
    let detail = json!({"tool_name": a.tool_name, "turn_execution_id": a.turn_execution_id, "reason": reason});
    let event = fleet_platform::store::AuditEvent {
        actor: by.0,
        via: by.1,
        action,
        target: id,
        count: 1,
        detail: Some(&detail),
    };
    crate::routes::audit::record(state, event).await;
}

/// Publishes the call's job now: its gate reads the decision. A job published twice is a copy.
async fn release(state: &AppState, stored: &StoredApproval) -> Result<(), ApiError> {
    let envelope =
        Envelope::decode(stored.job.as_bytes(), Some(fleet_protocol::envelope::CONTENT_TYPE)).map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("approval {}'s job does not parse: {e}", stored.approval.id),
            )
        })?;
    publish(state, &envelope).await.map_err(|failure| match failure {
        EnqueueFailure::BeforePublish(e) => e,
        EnqueueFailure::Publish(e) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "broker_unavailable",
            format!("the decision is recorded but its call was not released ({e}); send the same decision again"),
        ),
    })
}

/// The approval `id` names, if the caller's tenancy sees it (another tenant's is not found).
async fn find(state: &AppState, tenancy: &Tenancy, id: &str) -> Result<StoredApproval, ApiError> {
    if !approvals::is_approval_id(id) {
        return Err(no_approval(id));
    }
    let stored = state.store.approvals().get(id).await?.ok_or_else(|| no_approval(id))?;
    if !tenancy.sees(stored.approval.tenant.as_deref()) {
        return Err(no_approval(id));
    }
    Ok(stored)
}

/// An approval as `tenancy` is shown it: a tenant's session by its key.
fn shown(tenancy: &Tenancy, mut approval: Approval) -> Approval {
    if tenancy.bound.is_some() {
        approval.session_id = fleet_protocol::tenant::session_key_shown(&approval.session_id).to_string();
    }
    approval
}

fn no_approval(id: &str) -> ApiError {
    ApiError::not_found(format!("no approval {id:?}"))
}

fn conflict(id: &str, now: ApprovalStatus) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "approval_decided",
        format!("approval {id} is {} already; a decision is taken once", now.as_str()),
    )
}

pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(list_approvals))
        .routes(utoipa_axum::routes!(get_approval, decide_approval))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_conflict_names_the_approval_and_its_status() {
        let e = super::conflict("apr_1", fleet_protocol::approvals::ApprovalStatus::Denied);
        assert_eq!((e.status.as_u16(), e.code), (409, "approval_decided"));
        assert!(e.message.contains("apr_1") && e.message.contains("denied"));
    }
}
