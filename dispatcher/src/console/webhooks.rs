//! The webhooks page: each subscription (URL without credentials, events, its retry schedule) and
//! its failed deliveries. A delivery is an execution of kind `webhook`; the failed ones come from
//! the executions index (its `kind:webhook` set, newest first, a bounded number of entries), the
//! dead-lettered with their dead letter (which names the subscription and the event, and is retried
//! from its own page), the ones failing now (`retrying`) with their last error.

use std::collections::BTreeMap;

use axum::extract::{Query, State};
use axum::response::{Html, IntoResponse, Response};

use fleet_platform::store::ExecutionFilter;
use fleet_protocol::dead_letters::DeadLetterRecord;
use fleet_protocol::execution::ExecutionRecord;
use fleet_protocol::execution::ExecutionStatus;
use fleet_protocol::timefmt::rfc3339_from_millis;

use crate::console::html::{self, esc, url};
use crate::console::pages::safe_url;
use crate::console::session::{self, Operator};
use crate::console::Params;
use crate::AppState;

/// Failed deliveries listed per table, and index entries looked at to find them.
const SHOWN: usize = 50;
const BUDGET: usize = 5_000;

/// A failed delivery as the page shows it: the subscription and event come from its dead letter.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Failed {
    pub execution: ExecutionRecord,
    pub webhook_id: Option<String>,
    pub event: Option<String>,
}

pub(crate) fn failed(execution: ExecutionRecord, dead: Option<&DeadLetterRecord>) -> Failed {
    let job = dead.and_then(|d| d.job.as_ref());
    let text = |k: &str| job.and_then(|j| j[k].as_str()).map(str::to_string);
    Failed { webhook_id: text("webhook_id"), event: text("event"), execution }
}

/// Dead-lettered deliveries per subscription.
pub(crate) fn per_webhook(failed: &[Failed]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for f in failed {
        if let Some(id) = &f.webhook_id {
            *out.entry(id.clone()).or_insert(0) += 1;
        }
    }
    out
}

async fn deliveries(state: &AppState, status: ExecutionStatus) -> Result<Vec<ExecutionRecord>, Response> {
    let filter = ExecutionFilter {
        kind: Some(fleet_protocol::envelope::JobKind::Webhook),
        status: Some(status),
        ..Default::default()
    };
    match state.store.console().list_executions(&filter, None, SHOWN, BUDGET).await {
        Ok((found, _)) => Ok(found),
        Err(e) => Err(session::unavailable(&e.to_string())),
    }
}

fn time(ms: i64) -> String {
    esc(&rfc3339_from_millis(ms))
}

fn dead_row(f: &Failed) -> Vec<String> {
    let e = &f.execution;
    vec![
        html::link(&format!("/console/dead-letters/{}", url(&e.execution_id)), &e.execution_id),
        html::opt(f.webhook_id.as_deref()),
        html::opt(f.event.as_deref()),
        e.attempts.to_string(),
        time(e.updated_at_ms),
        html::opt(e.last_error.as_deref()),
    ]
}

/// `GET /console/webhooks?webhook_id=…`.
pub(crate) async fn page(State(state): State<AppState>, op: Operator, Query(p): Query<Params>) -> Response {
    let viewer = op.viewer();
    let hooks = match state.store.registry().list_webhooks(None, 200).await {
        Ok(h) => h,
        Err(e) => return session::unavailable(&e.to_string()),
    };
    let (dead, retrying) = match (
        deliveries(&state, ExecutionStatus::DeadLettered).await,
        deliveries(&state, ExecutionStatus::Retrying).await,
    ) {
        (Ok(d), Ok(r)) => (d, r),
        (Err(page), _) | (_, Err(page)) => return page,
    };
    let ids: Vec<String> = dead.iter().map(|e| e.execution_id.clone()).collect();
    let records = state.store.dead_letters().get_dead_letters(&ids).await.unwrap_or_default();
    let failed: Vec<Failed> =
        dead.into_iter().enumerate().map(|(i, e)| failed(e, records.get(i).and_then(Option::as_ref))).collect();
    let counts = per_webhook(&failed);
    let only = p.get("webhook_id").map(|w| w.trim()).filter(|w| !w.is_empty());
    let hook_rows: Vec<Vec<String>> = hooks
        .iter()
        .map(|h| {
            let n = counts.get(&h.id).copied().unwrap_or(0);
            vec![
                format!("<span id=\"{}\">{}</span>", esc(&url(&h.id)), esc(&h.id)),
                esc(&safe_url(&h.url)),
                esc(&h.events.join(", ")),
                h.retry
                    .as_ref()
                    .map(|r| format!("<code>{}</code>", esc(&serde_json::json!(r).to_string())))
                    .unwrap_or_else(|| "fleet default".into()),
                time(h.updated_at_ms),
                format!(
                    "<span id=\"failed-{}\">{n}</span> {}",
                    esc(&url(&h.id)),
                    html::link(&format!("/console/webhooks?webhook_id={}", url(&h.id)), "show")
                ),
            ]
        })
        .collect();
    let dead_rows: Vec<Vec<String>> =
        failed.iter().filter(|f| only.is_none_or(|w| f.webhook_id.as_deref() == Some(w))).map(dead_row).collect();
    let retry_rows: Vec<Vec<String>> = retrying
        .iter()
        .map(|e| {
            vec![
                html::link(&format!("/console/executions/{}", url(&e.execution_id)), &e.execution_id),
                e.attempts.to_string(),
                time(e.updated_at_ms),
                html::opt(e.last_error.as_deref()),
            ]
        })
        .collect();
    let scope = only.map(|w| format!(" of {}", esc(w))).unwrap_or_default();
    let body = format!(
        "<h2>Subscriptions</h2>{}<h2>Dead-lettered deliveries{scope}</h2>{}\
         <p class=\"hint\">The newest {SHOWN}, among the latest {BUDGET} deliveries; each is retried from its dead letter's page. {}</p>\
         <h2>Failing now (to be retried)</h2>{}",
        html::table(&["Id", "URL", "Events", "Retry", "Updated", "Dead-lettered deliveries"], &hook_rows),
        html::table(&["Delivery", "Webhook", "Event", "Attempts", "Dead-lettered", "Last error"], &dead_rows),
        html::link("/console/executions?kind=webhook", "Every delivery →"),
        html::table(&["Delivery", "Attempts", "Last try", "Last error"], &retry_rows),
    );
    Html(html::page("Webhooks", Some(&viewer), &body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn summary(id: &str) -> ExecutionRecord {
        ExecutionRecord {
            execution_id: id.into(),
            kind: fleet_protocol::envelope::JobKind::Webhook,
            run_at_ms: None,
            status: ExecutionStatus::DeadLettered,
            tool_name: None,
            room_id: None,
            assistant_id: None,
            tenant: None,
            created_at_ms: 0,
            updated_at_ms: 0,
            attempts: 3,
            last_error: Some("HTTP 500".into()),
        }
    }

    #[test]
    fn a_failed_delivery_names_its_subscription_and_event_from_its_dead_letter() {
        let record: DeadLetterRecord = serde_json::from_value(json!({
            "execution_id": "exec_1", "kind": "webhook", "tool_name": null, "assistant_id": null, "room_id": null,
            "attempts": 3, "last_error": "HTTP 500", "first_attempt_at": null, "last_attempt_at": null,
            "reason": "exhausted", "dead_lettered_at": "2026-01-01T00:00:00Z", "history": [],
            "job": {"kind": "webhook", "webhook_id": "wh_1", "event": "tool.callback.failed", "payload": {}}
        }))
        .unwrap();
        let shown = [failed(summary("exec_1"), Some(&record)), failed(summary("exec_2"), None)];
        assert_eq!(shown[0].webhook_id.as_deref(), Some("wh_1"));
        assert_eq!(shown[0].event.as_deref(), Some("tool.callback.failed"));
        assert_eq!(shown[1].webhook_id, None, "its dead letter is gone (retried or purged)");
        assert_eq!(per_webhook(&shown), BTreeMap::from([("wh_1".to_string(), 1)]));
    }
}
