//! The approvals page: calls waiting for an operator's decision (every tenant's), each with its
//! tool, effects, masked arguments and deadline, and approve / deny buttons. A decision is the
//! API's (`routes::approvals::decide`): taken once, audited, and the call released.

use axum::extract::{Path, State};
use axum::response::{Html, IntoResponse, Response};
use serde_json::Value;

use fleet_protocol::approvals::{ApprovalDecision, ApprovalStatus};

use crate::console::html::{self, esc, url};
use crate::console::session::{self, Change, Operator};
use crate::tenancy::Tenancy;
use crate::AppState;

/// Pending approvals the page lists.
const SHOWN: usize = 100;

/// `GET /console/approvals`.
pub(crate) async fn page(State(state): State<AppState>, op: Operator) -> Response {
    let viewer = op.viewer();
    let pending = match state.store.approvals().list(None, Some(ApprovalStatus::Pending), SHOWN).await {
        Ok(found) => found,
        Err(e) => return session::unavailable(&e.to_string()),
    };
    let rows: Vec<Vec<String>> = pending
        .iter()
        .map(|a| {
            let path = |what: &str| format!("/console/approvals/{}/{what}", url(&a.id));
            let effects: Vec<&str> = a.effects.iter().map(|e| e.as_str()).collect();
            vec![
                esc(&a.id),
                esc(a.tenant.as_deref().unwrap_or("")),
                html::link(&format!("/console/sessions?session_id={}", url(&a.session_id)), &a.session_id),
                esc(a.tool_configuration_name.as_deref().unwrap_or(&a.tool_name)),
                esc(&effects.join(", ")),
                format!("<code>{}</code>", esc(&Value::to_string(&a.parameters))),
                esc(&a.deadline),
                format!(
                    "{} {}",
                    html::button(&viewer, &path("approve"), "Approve", "primary"),
                    html::button(&viewer, &path("deny"), "Deny", "danger")
                ),
            ]
        })
        .collect();
    let body = format!(
        "<h2>Pending approvals</h2>{}<p class=\"hint\">A call of a tool with <code>requires_approval</code> waits here, \
         holding no worker, until it is approved or denied, or its deadline applies its tool's timeout outcome.</p>",
        html::table(&["Approval", "Tenant", "Session", "Tool", "Effects", "Arguments", "Deadline", ""], &rows)
    );
    Html(html::page("Approvals", Some(&viewer), &body)).into_response()
}

/// `POST /console/approvals/{id}/approve`.
pub(crate) async fn approve(state: State<AppState>, id: Path<String>, change: Change) -> Response {
    decide(state, id, change, ApprovalDecision::Approve).await
}

/// `POST /console/approvals/{id}/deny`.
pub(crate) async fn deny(state: State<AppState>, id: Path<String>, change: Change) -> Response {
    decide(state, id, change, ApprovalDecision::Deny).await
}

async fn decide(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Change { op, form }: Change,
    decision: ApprovalDecision,
) -> Response {
    let viewer = op.viewer();
    let reason = form.get("reason").cloned();
    let operators = Tenancy::default();
    let by = (op.actor.as_str(), "console");
    let back = html::link("/console/approvals", "← Approvals");
    match crate::routes::approvals::decide(&state, &operators, &id, decision, reason, by).await {
        Ok(decided) => super::outcome(&viewer, "Approval", &format!("{id}: {}", decided.status.as_str()), true, &back),
        Err(e) => super::outcome(&viewer, "Approval", &e.message, false, &back),
    }
}
