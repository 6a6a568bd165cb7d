//! The console's other pages: the overview (queues, rates, open circuits), executions (list,
//! detail, cancel), tools (policies, circuits and their history, close one), sessions (history, forget,
//! a live tail through a stream token) and the audit log.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::response::{Html, IntoResponse, Response};
use serde_json::{json, Value};

use fleet_platform::now_ms;
use fleet_platform::store::CircuitEvent;
use fleet_protocol::activity::KindActivity;
use fleet_protocol::envelope::JobKind;
use fleet_protocol::timefmt::rfc3339_from_millis;

use crate::console::html::{self, esc, url};
use crate::console::session::{self, Change, Operator};
use crate::console::{self, fail, outcome, Params};
use crate::AppState;

/// A URL as the console shows it: scheme, host and path only (a query string or user info may
/// hold a credential).
pub(crate) fn safe_url(raw: &str) -> String {
    fleet_protocol::sanitize::url_without_credentials(raw)
}

/// A stored session id as an operator reads it: a tenant's session as `key (tenant)`.
pub(crate) fn session_label(stored: &str) -> String {
    match stored.split_once(fleet_protocol::tenant::SESSION_SCOPE_SEPARATOR) {
        Some((tenant, key)) => format!("{key} (tenant {tenant})"),
        None => stored.to_string(),
    }
}

fn time(ms: Option<i64>) -> String {
    ms.filter(|m| *m > 0).map(|m| esc(&rfc3339_from_millis(m))).unwrap_or_else(|| "—".into())
}

fn queue_rows(state: &AppState, activity: &BTreeMap<String, KindActivity>) -> Vec<Vec<String>> {
    let m = &state.metrics;
    let topology = &state.config.common.topology;
    JobKind::ALL
        .iter()
        .map(|kind| {
            let work = topology.work_queue(*kind);
            let waiting_in = topology.waiting_queues(*kind);
            let depth = |q: &String| m.queue_messages.with_label_values(&[q]).get();
            let waiting: i64 = waiting_in.iter().map(depth).sum();
            let delayed: i64 = topology
                .queues()
                .iter()
                .filter(|q| !waiting_in.contains(&q.name) && q.name.contains(kind.as_str()))
                .map(|q| depth(&q.name))
                .sum();
            let k = kind.as_str();
            let running = activity.get(k).map_or(0, |a| a.running);
            vec![
                esc(k),
                waiting.to_string(),
                format!("<span id=\"running-{k}\">{running}</span>"),
                m.queue_consumers.with_label_values(&[&work]).get().to_string(),
                delayed.to_string(),
                format!("{:.1} s", m.oldest_job_age.with_label_values(&[k]).get()),
            ]
        })
        .collect()
}

/// Per kind: accepted in the last 15 minutes, then succeeded, failed and dead-lettered in the
/// last minute and the last 15 (each cell with an id a test can read: `succeeded-1m-tool_call`).
fn finished_rows(accepted: &[u64], activity: &BTreeMap<String, KindActivity>) -> Vec<Vec<String>> {
    JobKind::ALL
        .iter()
        .zip(accepted)
        .map(|(kind, accepted)| {
            let k = kind.as_str();
            let a = activity.get(k).copied().unwrap_or_default();
            let mut row = vec![esc(k), accepted.to_string()];
            for (tally, minute, quarter) in [
                ("succeeded", a.last_minute.succeeded, a.last_15_minutes.succeeded),
                ("failed", a.last_minute.failed, a.last_15_minutes.failed),
                ("dead_lettered", a.last_minute.dead_lettered, a.last_15_minutes.dead_lettered),
            ] {
                row.push(format!(
                    "<span id=\"{tally}-1m-{k}\">{minute}</span> / <span id=\"{tally}-15m-{k}\">{quarter}</span>"
                ));
            }
            row
        })
        .collect()
}

/// `GET /console`.
pub(crate) async fn overview(State(state): State<AppState>, op: Operator) -> Response {
    let viewer = op.viewer();
    let now = now_ms();
    let since = now - 15 * 60_000;
    let mut accepted = vec![];
    for kind in JobKind::ALL {
        accepted
            .push(state.store.console().executions_since(&format!("kind:{}", kind.as_str()), since).await.unwrap_or(0));
    }
    let activity = state.store.console().activity(now).await.unwrap_or_default();
    let dead_recent = state.store.dead_letters().dead_letters_since(now - 5 * 60_000).await.unwrap_or(0);
    let open = state.store.limits().open_circuits(100).await.unwrap_or_default();
    let circuits: Vec<Vec<String>> =
        open.iter().map(|t| vec![html::link(&format!("/console/tools#{}", url(t)), t)]).collect();
    let grafana = state
        .config
        .console_grafana_url
        .as_deref()
        .map(|g| format!("<p>{}</p>", html::link(g, "Grafana dashboard →")))
        .unwrap_or_default();
    let stored = state.metrics.dead_letters_stored.get();
    let firing = firing_conditions(&state, open.len(), dead_recent, &activity);
    let body = format!(
        "{grafana}<h2>Queues</h2>{}<h2>Finished: last minute / last 15 minutes</h2>{}\
         <p class=\"hint\">Workers report what they finished every {} s; \"failed\" is an attempt that failed and is retried.</p>\
         <p>Dead-lettered in the last 5 minutes: <b>{dead_recent}</b>; stored: <b>{stored}</b>.</p>\
         <h2>Conditions the alert rules fire on</h2>{}<h2>Open circuits</h2>{}",
        html::table(
            &["Kind", "Waiting", "In flight", "Consumers", "Delayed / parked", "Oldest waiting"],
            &queue_rows(&state, &activity)
        ),
        html::table(
            &["Kind", "Accepted (15 m)", "Succeeded", "Failed", "Dead-lettered"],
            &finished_rows(&accepted, &activity)
        ),
        fleet_protocol::activity::REPORT_EVERY_SECS,
        firing,
        html::table(&["Tool"], &circuits),
    );
    Html(html::page("Overview", Some(&viewer), &body)).into_response()
}

/// `FleetErrorRatioHigh`'s condition over the last 15 minutes: the share of a kind's finished
/// jobs that ended dead-lettered, if above the rule's 5%.
pub(crate) fn error_ratio_firing(kind: &str, a: &KindActivity) -> Option<String> {
    let c = a.last_15_minutes;
    let finished = c.succeeded + c.failed + c.dead_lettered;
    let ratio = c.dead_lettered as f64 / finished.max(1) as f64;
    (ratio > 0.05).then(|| {
        format!("{:.0}% of finished {kind} jobs were dead-lettered in the last 15 minutes (over 5%)", ratio * 100.0)
    })
}

/// The alert rules' conditions that hold now (the same thresholds as `deploy/`'s rules).
fn firing_conditions(
    state: &AppState,
    open_circuits: usize,
    dead_recent: u64,
    activity: &BTreeMap<String, KindActivity>,
) -> String {
    let m = &state.metrics;
    let mut firing: Vec<String> = activity.iter().filter_map(|(kind, a)| error_ratio_firing(kind, a)).collect();
    for kind in JobKind::ALL {
        let age = m.oldest_job_age.with_label_values(&[kind.as_str()]).get();
        if age > 300.0 {
            firing.push(format!("{} jobs have waited over 5 minutes ({age:.0} s)", kind.as_str()));
        }
        if m.queue_consumers.with_label_values(&[&state.config.common.topology.work_queue(kind)]).get() == 0 {
            firing.push(format!("no worker consumes {} jobs", kind.as_str()));
        }
    }
    if open_circuits > 0 {
        firing.push(format!("{open_circuits} tool circuit(s) open"));
    }
    if dead_recent > 0 {
        firing.push(format!("{dead_recent} dead letter(s) in the last 5 minutes"));
    }
    if firing.is_empty() {
        return "<p class=\"ok\">None.</p>".into();
    }
    format!("<ul class=\"firing\">{}</ul>", firing.iter().map(|f| format!("<li>{}</li>", esc(f))).collect::<String>())
}

fn execution_filter_form(p: &Params) -> String {
    let statuses: String = ["", "queued", "running", "retrying", "succeeded", "failed", "dead_lettered", "cancelled"]
        .iter()
        .map(|s| {
            let sel = p.get("status").map(String::as_str).unwrap_or("") == *s;
            format!(
                "<option value=\"{s}\"{}>{}</option>",
                if sel { " selected" } else { "" },
                if s.is_empty() { "any status" } else { s }
            )
        })
        .collect();
    let get = |k: &str| p.get(k).map(String::as_str);
    format!(
        "<form method=\"get\" action=\"/console/executions\" class=\"filters\"><label>Status <select name=\"status\">{statuses}</select></label>{}{}{}{}{}{}<button>Filter</button></form>",
        html::input("kind", "Kind", get("kind")),
        html::input("tool_name", "Tool", get("tool_name")),
        html::input("room_id", "Room / session", get("room_id")),
        html::input("assistant_id", "Assistant", get("assistant_id")),
        html::input("since", "Since", get("since")),
        html::input("until", "Until", get("until")),
    )
}

/// `GET /console/executions`.
pub(crate) async fn executions(State(state): State<AppState>, op: Operator, Query(p): Query<Params>) -> Response {
    let viewer = op.viewer();
    let query: crate::routes::executions::ExecutionQuery = match serde_json::from_value(json!(p
        .iter()
        .filter(|(k, v)| !v.is_empty() && *k != "limit")
        .collect::<std::collections::HashMap<_, _>>()))
    {
        Ok(q) => q,
        Err(e) => return fail(&viewer, "Executions", &e.to_string()),
    };
    let (filter, cursor, limit) = match crate::routes::executions::execution_filter(query) {
        Ok(f) => f,
        Err(e) => return fail(&viewer, "Executions", &e.message),
    };
    let (found, next) = match state.store.console().list_executions(&filter, cursor, limit, 5_000).await {
        Ok(r) => r,
        Err(e) => return session::unavailable(&e.to_string()),
    };
    let rows: Vec<Vec<String>> = found
        .iter()
        .map(|e| {
            vec![
                html::link(&format!("/console/executions/{}", url(&e.execution_id)), &e.execution_id),
                esc(e.kind.as_str()),
                format!("<span class=\"status {0}\">{0}</span>", esc(e.status.as_str())),
                html::opt(e.tool_name.as_deref()),
                html::opt(e.room_id.as_deref().map(session_label).as_deref()),
                e.attempts.to_string(),
                time(Some(e.created_at_ms)),
                html::opt(e.last_error.as_deref()),
            ]
        })
        .collect();
    let more = next.map(|c| {
        let mut q: Vec<String> = p
            .iter()
            .filter(|(k, v)| *k != "cursor" && !v.is_empty())
            .map(|(k, v)| format!("{}={}", url(k), url(v)))
            .collect();
        q.push(format!("cursor={}", url(&c.to_string())));
        format!("<p class=\"more\">{}</p>", html::link(&format!("/console/executions?{}", q.join("&")), "Next page →"))
    });
    let body = format!(
        "{}{}{}",
        execution_filter_form(&p),
        html::table(&["Execution", "Kind", "Status", "Tool", "Room", "Attempts", "Created", "Last error"], &rows),
        more.unwrap_or_default()
    );
    Html(html::page("Executions", Some(&viewer), &body)).into_response()
}

/// `GET /console/executions/{id}`: the record, its attempts, a turn's rounds and usage, cancel.
pub(crate) async fn execution(State(state): State<AppState>, op: Operator, Path(id): Path<String>) -> Response {
    let viewer = op.viewer();
    let view = match state.store.executions().get_execution(&id).await {
        Ok(Some(v)) => v,
        Ok(None) => return fail(&viewer, "Execution", &format!("No execution {id:?}.")),
        Err(e) => return session::unavailable(&e.to_string()),
    };
    let fields = [
        ("Kind", Some(view.record.kind.as_str().to_string())),
        ("Status", Some(view.record.status.as_str().to_string())),
        ("Tool", view.record.tool_name.clone()),
        ("Room", view.record.room_id.as_deref().map(session_label)),
        ("Assistant", view.record.assistant_id.clone()),
        ("Last error", view.record.last_error.clone()),
    ];
    let mut dl: String = fields
        .iter()
        .map(|(k, v)| {
            format!(
                "<dt>{k}</dt><dd id=\"field-{}\">{}</dd>",
                k.to_lowercase().replace(' ', "-"),
                html::opt(v.as_deref())
            )
        })
        .collect();
    dl.push_str(&format!(
        "<dt>Created</dt><dd>{}</dd><dt>Updated</dt><dd>{}</dd>",
        time(Some(view.record.created_at_ms)),
        time(Some(view.record.updated_at_ms))
    ));
    let attempts: Vec<Vec<String>> = view
        .attempts
        .iter()
        .map(|a| {
            let a = serde_json::to_value(a).unwrap_or_default();
            ["attempt", "started_at", "http_status", "outcome", "error", "duration_ms"]
                .iter()
                .map(|k| match &a[*k] {
                    Value::Null => "—".to_string(),
                    Value::String(s) => esc(s),
                    v => esc(&v.to_string()),
                })
                .collect()
        })
        .collect();
    let turn = if view.record.kind == fleet_protocol::envelope::JobKind::Turn {
        match crate::routes::turns::turn_summary(&state, &id).await {
            Ok(Some(t)) => format!(
                "<h2>Turn: rounds, tool calls, usage</h2>{}",
                html::json_block(&crate::console::dead_letters::redact(&serde_json::to_value(&t).unwrap_or_default()))
            ),
            _ => String::new(),
        }
    } else {
        String::new()
    };
    let result = view
        .result
        .as_ref()
        .map(|r| format!("<h2>Result</h2>{}", html::json_block(&crate::console::dead_letters::redact(r))))
        .unwrap_or_default();
    let external = view
        .external_result
        .as_ref()
        .and_then(|r| serde_json::to_value(r).ok())
        .map(|r| {
            let status = esc(r["status"].as_str().unwrap_or_default());
            let block = html::json_block(&crate::console::dead_letters::redact(&r));
            format!("<h2>Structured result: <span id=\"external-status\">{status}</span></h2>{block}")
        })
        .unwrap_or_default();
    let cancel = if view.record.status.is_final() {
        String::new()
    } else {
        html::button(&viewer, &format!("/console/executions/{}/cancel", url(&id)), "Cancel", "danger")
    };
    let body = format!(
        "<dl>{dl}</dl><div class=\"actions\">{cancel}</div><h2>Attempts</h2>{}{turn}{result}{external}",
        html::table(&["#", "Started", "HTTP status", "Outcome", "Error", "Duration (ms)"], &attempts)
    );
    Html(html::page(&format!("Execution {id}"), Some(&viewer), &body)).into_response()
}

/// `POST /console/executions/{id}/cancel`.
pub(crate) async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Change { op, .. }: Change,
) -> Response {
    let viewer = op.viewer();
    match crate::routes::executions::cancel(&state, &id).await {
        Ok(answer) => {
            let detail = answer.detail();
            console::audit(&state, &op.actor, "execution.cancel", &id, 1, Some(&detail)).await;
            let back = html::link(&format!("/console/executions/{}", url(&id)), "← Execution");
            outcome(&viewer, "Cancel", &format!("{id}: {}", answer.status.as_str()), true, &back)
        }
        Err(e) => fail(&viewer, "Cancel", &e.message),
    }
}

/// One circuit change as the tools page lists it.
fn history_row(tool: &str, e: &CircuitEvent) -> Vec<String> {
    let probes = match (e.probes, e.last_probe_ms) {
        (Some(n), Some(last)) if n > 1 => format!(" ({n} probes, the latest at {})", time(Some(last))),
        _ => String::new(),
    };
    vec![
        esc(tool),
        time(Some(e.at_ms)),
        format!("<span class=\"circuit {0}\">{0}</span>", esc(&e.state)),
        format!("{}{probes}", esc(&e.why)),
        html::opt(e.by.as_deref()),
    ]
}

/// `GET /console/tools`: tools (policies, circuit) and their circuits' history.
pub(crate) async fn tools(State(state): State<AppState>, op: Operator) -> Response {
    let viewer = op.viewer();
    let tools = match state.store.registry().list_tools(None, 200).await {
        Ok(t) => t,
        Err(e) => return session::unavailable(&e.to_string()),
    };
    let mut rows = vec![];
    let mut history = vec![];
    for v in &tools {
        let t = &v.tool;
        let health = state.store.limits().tool_health(&t.name).await.unwrap_or_default();
        let changes = state.store.limits().circuit_history(&t.name, 10).await.unwrap_or_default();
        history.extend(changes.iter().map(|e| (e.at_ms, history_row(&t.name, e))));
        let policy = json!({"retry": t.retry, "limits": t.limits, "circuit_breaker": t.circuit_breaker});
        let close = if health.open {
            html::button(&viewer, &format!("/console/tools/{}/close-circuit", url(&t.name)), "Close circuit", "primary")
        } else {
            String::new()
        };
        rows.push(vec![
            format!("<span id=\"{}\">{}</span>", esc(&url(&t.name)), esc(&t.name)),
            esc(&safe_url(&t.callback_url)),
            format!("<code>{}</code>", esc(&policy.to_string())),
            format!(
                "{} ({} failures in a row)",
                if health.open { "<b class=\"bad\">open</b>" } else { "closed" },
                health.consecutive_failures
            ),
            format!("{} / {}", time(health.last_success_ms), time(health.last_failure_ms)),
            format!(
                "{close} {}",
                html::link(&format!("/console/dead-letters?tool_name={}", url(&t.name)), "dead letters")
            ),
        ]);
    }
    history.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
    let history: Vec<Vec<String>> = history.into_iter().map(|(_, row)| row).collect();
    let body = format!(
        "<h2>Tools</h2>{}<h2>Circuit history</h2><div id=\"circuit-history\">{}</div>\
         <p class=\"hint\">The latest 10 changes per tool, newest first: opened (after how many failures, and the last one's error), \
         half-open (a probe call let through), closed (a call succeeded, or an operator closed it).</p><p>{}</p>",
        html::table(&["Tool", "Callback", "Policies", "Circuit", "Last success / failure", ""], &rows),
        html::table(&["Tool", "When", "State", "Why", "By"], &history),
        html::link("/console/webhooks", "Webhooks and their failed deliveries →")
    );
    Html(html::page("Tools", Some(&viewer), &body)).into_response()
}

/// `POST /console/tools/{name}/close-circuit`.
pub(crate) async fn close_circuit(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Change { op, .. }: Change,
) -> Response {
    let was_open = match state.store.limits().close_circuit(&name, now_ms(), &op.actor).await {
        Ok(w) => w,
        Err(e) => return session::unavailable(&e.to_string()),
    };
    let detail = json!({"was_open": was_open});
    console::audit(&state, &op.actor, "circuit.close", &name, u64::from(was_open), Some(&detail)).await;
    let text = format!("{name}'s circuit is closed.");
    outcome(&op.viewer(), "Close circuit", &text, true, &html::link("/console/tools", "← Tools"))
}

/// `GET /console/sessions?id=…`: a session's history, a live tail, forget.
pub(crate) async fn sessions(State(state): State<AppState>, op: Operator, Query(p): Query<Params>) -> Response {
    let viewer = op.viewer();
    let form = format!(
        "<form method=\"get\" action=\"/console/sessions\" class=\"filters\">{}{}<button>Open</button></form>",
        html::input("id", "Session (room) id", p.get("id").map(String::as_str)),
        html::input("tenant", "Tenant (a tenant-bound token's session)", p.get("tenant").map(String::as_str))
    );
    let Some(key) = p.get("id").map(|i| i.trim()).filter(|i| !i.is_empty()) else {
        return Html(html::page("Sessions", Some(&viewer), &form)).into_response();
    };
    if let Err(e) = crate::validate::identifier("session id", Some(key)) {
        return fail(&viewer, "Sessions", &e.message);
    }
    let tenant = p.get("tenant").map(|t| t.trim()).filter(|t| !t.is_empty());
    if tenant.is_some_and(|t| !fleet_protocol::tenant::is_tenant_name(t)) {
        return fail(&viewer, "Sessions", "tenant must be 1-64 characters of A-Z, a-z, 0-9, '.', '_' and '-'");
    }
    let stored = fleet_protocol::tenant::session_storage_id(tenant, key);
    let id = stored.as_ref();
    let scope = tenant.map(|t| format!("?tenant={}", url(t))).unwrap_or_default();
    let history = match state.store.sessions().history(id).await {
        Ok(h) => h,
        Err(e) => return session::unavailable(&e.to_string()),
    };
    let rows: Vec<Vec<String>> = history
        .iter()
        .map(|h| {
            let m = h.to_api();
            vec![
                esc(&m.role),
                esc(m.content.as_deref().unwrap_or("")),
                esc(&m.created_at),
                html::opt(Some(m.execution_id.as_str())),
            ]
        })
        .collect();
    let token = crate::routes::stream::stream_token_for(&state, id);
    let stream = format!("/v1/sessions/{}/stream?since=start&token={}", url(key), url(&token.token));
    let forget = html::button(
        &viewer,
        &format!("/console/sessions/{}/forget{scope}", url(key)),
        "Forget this session",
        "danger",
    );
    let body = format!(
        "{form}<div class=\"actions\">{forget} {}</div><h2>Live tail</h2><ol id=\"tail\" class=\"tail\" data-stream=\"{}\"></ol><h2>History</h2>{}",
        html::link(&format!("/console/executions?room_id={}", url(id)), "Its executions →"),
        esc(&stream),
        html::table(&["Role", "Content", "At", "Execution"], &rows)
    );
    Html(html::page(&format!("Session {}", session_label(id)), Some(&viewer), &body)).into_response()
}

/// `POST /console/sessions/{id}/forget`.
pub(crate) async fn forget(
    State(state): State<AppState>,
    Path(key): Path<String>,
    Query(p): Query<Params>,
    Change { op, .. }: Change,
) -> Response {
    let viewer = op.viewer();
    if let Err(e) = crate::validate::identifier("session id", Some(&key)) {
        return fail(&viewer, "Forget", &e.message);
    }
    let tenant = p.get("tenant").map(String::as_str).filter(|t| fleet_protocol::tenant::is_tenant_name(t));
    let id = fleet_protocol::tenant::session_storage_id(tenant, &key).into_owned();
    if let Err(e) = crate::routes::sessions::forget(&state, &id).await {
        return session::unavailable(&e.message);
    }
    console::audit(&state, &op.actor, "session.forget", &id, 1, None).await;
    let text = format!("Session {} is forgotten.", session_label(&id));
    outcome(&viewer, "Forget", &text, true, &html::link("/console/sessions", "← Sessions"))
}

/// `GET /console/audit`.
pub(crate) async fn audit(State(state): State<AppState>, op: Operator, Query(p): Query<Params>) -> Response {
    let viewer = op.viewer();
    let cursor = p.get("cursor").map(String::as_str).filter(|c| fleet_platform::store::is_cursor(c));
    let (entries, next) = match state.store.audit().audit_page(cursor, 100).await {
        Ok(r) => r,
        Err(e) => return session::unavailable(&e.to_string()),
    };
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                time(Some(e.at_ms)),
                esc(&e.actor),
                esc(&e.via),
                esc(&e.action),
                esc(&e.target),
                e.count.to_string(),
                e.detail.as_ref().map(|d| format!("<code>{}</code>", esc(&d.to_string()))).unwrap_or_default(),
            ]
        })
        .collect();
    let more = next.map(|c| {
        format!("<p class=\"more\">{}</p>", html::link(&format!("/console/audit?cursor={}", url(&c)), "Older →"))
    });
    let body = format!(
        "{}{}",
        html::table(&["When", "Who", "Via", "What", "Target", "How many", "Detail"], &rows),
        more.unwrap_or_default()
    );
    Html(html::page("Audit log", Some(&viewer), &body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_ratio_fires_above_five_percent_of_what_finished() {
        use fleet_protocol::activity::Counts;
        let at = |succeeded, dead_lettered| KindActivity {
            last_15_minutes: Counts { succeeded, failed: 0, dead_lettered },
            ..Default::default()
        };
        assert_eq!(error_ratio_firing("tool_call", &at(95, 5)), None, "5% is not over");
        let shown = error_ratio_firing("tool_call", &at(90, 10)).unwrap();
        assert!(shown.starts_with("10% of finished tool_call jobs"), "{shown}");
        assert_eq!(error_ratio_firing("turn", &at(0, 0)), None);
    }

    #[test]
    fn a_url_is_shown_without_its_query_or_user_info() {
        assert_eq!(
            safe_url("https://user:pw@hooks.example.com:8443/in?token=s3cret"),
            "https://hooks.example.com:8443/in"
        );
        assert_eq!(safe_url("nonsense"), "(not a URL)");
    }
}
