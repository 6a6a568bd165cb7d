//! The dead-letter pages: the list (filters, search by execution id, room, assistant or a
//! parameters substring, counts by reason and tool), a dead letter's detail (attempts, the job with
//! secrets redacted, a poison body's excerpt), retry, retry with edited parameters (checked
//! against the tool's schema, audited), and the bulk redrive and purge, each with a preview.

use std::collections::{BTreeMap, HashMap};

use axum::extract::{Path, Query, State};
use axum::response::{Html, IntoResponse, Response};
use serde_json::{json, Value};

use fleet_platform::dead_letters::{self, Action, LetterOutcome};
use fleet_protocol::dead_letters::{DeadLetterFilter, DeadLetterReason, DeadLetterRecord, ListCursor};

use crate::console::html::{self, esc, url, Viewer};
use crate::console::session::{self, Change, Operator};
use crate::console::{self, fail, Params};
use crate::AppState;

/// Index entries one list page looks at, at most (its counts are of these).
const PAGE_BUDGET: usize = 2_000;
const PAGE_SIZE: usize = 50;
const SCAN_PAGE: usize = 500;

/// The list's filter and search, as a form sends them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Search {
    pub filter: DeadLetterFilter,
    /// A substring of the execution id, room, assistant, tool or parameters.
    pub q: Option<String>,
}

impl Search {
    /// Reads the fields of a query or form; an unknown reason or a bad time names itself.
    pub(crate) fn parse(p: &HashMap<String, String>) -> Result<Search, String> {
        let get = |k: &str| p.get(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let reason = match get("reason") {
            Some(r) => {
                Some(serde_json::from_value::<DeadLetterReason>(json!(r)).map_err(|_| format!("no reason {r:?}"))?)
            }
            None => None,
        };
        let filter = DeadLetterFilter {
            execution_ids: vec![],
            tool_name: get("tool_name"),
            reason,
            since: get("since"),
            until: get("until"),
        };
        filter.validate().map_err(|field| format!("{field} must be an RFC 3339 timestamp"))?;
        Ok(Search { filter, q: get("q") })
    }

    pub(crate) fn matches(&self, r: &DeadLetterRecord) -> bool {
        self.filter.matches(r) && self.q.as_deref().is_none_or(|q| search_hit(r, q))
    }

    /// The fields as hidden inputs, so a preview's confirmation acts on the same filter.
    fn hidden(&self) -> String {
        self.pairs().iter().map(|(k, v)| format!("<input type=\"hidden\" name=\"{k}\" value=\"{}\">", esc(v))).collect()
    }

    fn pairs(&self) -> Vec<(&'static str, String)> {
        let f = &self.filter;
        let mut out = vec![];
        for (k, v) in [("tool_name", &f.tool_name), ("since", &f.since), ("until", &f.until), ("q", &self.q)] {
            if let Some(v) = v {
                out.push((k, v.clone()));
            }
        }
        if let Some(r) = f.reason {
            out.push(("reason", r.as_str().to_string()));
        }
        out
    }

    /// What the audit log names as the target.
    pub(crate) fn text(&self) -> String {
        let pairs = self.pairs();
        if pairs.is_empty() {
            return "all".into();
        }
        pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
    }
}

/// Whether `q` is found in the record's id, room, assistant, tool or parameters.
pub(crate) fn search_hit(r: &DeadLetterRecord, q: &str) -> bool {
    let params = r.job.as_ref().and_then(|j| j.get("parameters")).map(|p| p.to_string()).unwrap_or_default();
    let fields = [r.execution_id.as_deref(), r.room_id.as_deref(), r.assistant_id.as_deref(), r.tool_name.as_deref()];
    params.contains(q) || fields.into_iter().flatten().any(|field| field.contains(q))
}

/// Replaces the values of keys that name a secret, at any depth.
pub(crate) fn redact(v: &Value) -> Value {
    const SECRET: [&str; 7] = ["secret", "token", "password", "authorization", "api_key", "apikey", "credential"];
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let lower = k.to_ascii_lowercase();
                    // `prompt_tokens`, `max_tokens`: counts of a model's tokens, not credentials.
                    let a_count = lower.ends_with("tokens");
                    if !a_count && SECRET.iter().any(|s| lower.contains(s)) {
                        (k.clone(), json!("[redacted]"))
                    } else {
                        (k.clone(), redact(v))
                    }
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redact).collect()),
        other => other.clone(),
    }
}

/// One pass over the index: up to `limit` matches after `cursor`, looking at no more than
/// `budget` entries, with counts by reason and tool of every match seen.
pub(crate) struct Scan {
    pub found: Vec<DeadLetterRecord>,
    pub next: Option<ListCursor>,
    pub scanned: usize,
    pub by_reason: BTreeMap<String, u64>,
    pub by_tool: BTreeMap<String, u64>,
    pub matched: u64,
}

pub(crate) async fn scan(
    state: &AppState,
    search: &Search,
    mut cursor: Option<ListCursor>,
    limit: usize,
    budget: usize,
) -> Result<Scan, fleet_platform::store::StoreError> {
    let mut s = Scan {
        found: vec![],
        next: None,
        scanned: 0,
        by_reason: BTreeMap::new(),
        by_tool: BTreeMap::new(),
        matched: 0,
    };
    while s.scanned < budget {
        let want = SCAN_PAGE.min(budget - s.scanned);
        let entries = state.store.dead_letters().list_dead_letters(cursor.as_ref(), want).await?;
        let exhausted = entries.len() < want;
        let ids: Vec<String> = entries.iter().map(|(id, _)| id.clone()).collect();
        let records = state.store.dead_letters().get_dead_letters(&ids).await?;
        for ((id, at), record) in entries.into_iter().zip(records) {
            s.scanned += 1;
            cursor = Some(ListCursor { at_ms: at, id });
            let Some(r) = record.filter(|r| search.matches(r)) else { continue };
            s.matched += 1;
            *s.by_reason.entry(r.reason.as_str().to_string()).or_default() += 1;
            *s.by_tool.entry(r.tool_name.clone().unwrap_or_else(|| "(none)".into())).or_default() += 1;
            if s.found.len() < limit {
                s.found.push(r);
                if s.found.len() == limit && limit < usize::MAX {
                    s.next = cursor.clone();
                }
            }
        }
        if exhausted {
            if s.found.len() < limit {
                s.next = None;
            }
            return Ok(s);
        }
    }
    if s.found.len() < limit {
        s.next = cursor;
    }
    Ok(s)
}

fn filter_form(search: &Search) -> String {
    let f = &search.filter;
    let reasons: String = ["", "exhausted", "permanent", "poison", "delivery_limit"]
        .iter()
        .map(|r| {
            let selected = f.reason.map(|x| x.as_str()) == Some(*r) || (r.is_empty() && f.reason.is_none());
            format!(
                "<option value=\"{r}\"{}>{}</option>",
                if selected { " selected" } else { "" },
                if r.is_empty() { "any reason" } else { r }
            )
        })
        .collect();
    format!(
        "<form method=\"get\" action=\"/console/dead-letters\" class=\"filters\">{}{}<label>Reason <select name=\"reason\">{reasons}</select></label>{}{}<button>Filter</button></form>",
        html::input("q", "Search (id, room, assistant, parameters)", search.q.as_deref()),
        html::input("tool_name", "Tool", f.tool_name.as_deref()),
        html::input("since", "Since (RFC 3339)", f.since.as_deref()),
        html::input("until", "Until", f.until.as_deref()),
    )
}

fn counts(title: &str, counts: &BTreeMap<String, u64>) -> String {
    let items: String = counts.iter().map(|(k, n)| format!("<li>{} <b>{n}</b></li>", esc(k))).collect();
    format!("<div class=\"counts\"><h3>{}</h3><ul>{items}</ul></div>", esc(title))
}

fn bulk_forms(viewer: &Viewer<'_>, search: &Search) -> String {
    if !viewer.can_change {
        return String::new();
    }
    let csrf = html::csrf_field(viewer.csrf);
    format!(
        "<div class=\"bulk\"><form method=\"post\" action=\"/console/dead-letters/redrive/preview\" class=\"inline\">{csrf}{h}<button>Redrive matching…</button></form>\
         <form method=\"post\" action=\"/console/dead-letters/purge/preview\" class=\"inline\">{csrf}{h}<button class=\"danger\">Purge matching…</button></form></div>",
        h = search.hidden()
    )
}

/// `GET /console/dead-letters`.
pub(crate) async fn list(State(state): State<AppState>, op: Operator, Query(p): Query<Params>) -> Response {
    let viewer = op.viewer();
    let search = match Search::parse(&p) {
        Ok(s) => s,
        Err(why) => return fail(&viewer, "Dead letters", &why),
    };
    let cursor = p.get("cursor").and_then(|c| ListCursor::parse(c));
    let s = match scan(&state, &search, cursor, PAGE_SIZE, PAGE_BUDGET).await {
        Ok(s) => s,
        Err(e) => return session::unavailable(&e.to_string()),
    };
    let rows: Vec<Vec<String>> = s
        .found
        .iter()
        .map(|r| {
            let id = r.execution_id.clone().unwrap_or_default();
            vec![
                html::link(&format!("/console/dead-letters/{}", url(&id)), &id),
                html::opt(r.tool_name.as_deref()),
                esc(r.reason.as_str()),
                r.attempts.to_string(),
                esc(&r.last_error),
                html::opt(r.room_id.as_deref()),
                esc(&r.dead_lettered_at),
            ]
        })
        .collect();
    let next = s.next.map(|c| {
        let mut q: Vec<String> = search.pairs().iter().map(|(k, v)| format!("{k}={}", url(v))).collect();
        q.push(format!("cursor={}", url(&c.to_string())));
        format!(
            "<p class=\"more\">{}</p>",
            html::link(&format!("/console/dead-letters?{}", q.join("&")), "Next page →")
        )
    });
    let body = format!(
        "{}<p class=\"summary\"><b>{}</b> stored in all; {} of the {} looked at match.</p><div class=\"row\">{}{}</div>{}{}{}",
        filter_form(&search),
        state.store.dead_letters().count_dead_letters().await.unwrap_or(0),
        s.matched,
        s.scanned,
        counts("By reason", &s.by_reason),
        counts("By tool", &s.by_tool),
        bulk_forms(&viewer, &search),
        html::table(&["Execution", "Tool", "Reason", "Attempts", "Last error", "Room", "Dead-lettered"], &rows),
        next.unwrap_or_default()
    );
    Html(html::page("Dead letters", Some(&viewer), &body)).into_response()
}

fn detail_body(viewer: &Viewer<'_>, r: &DeadLetterRecord, id: &str) -> String {
    let fields = [
        ("Execution", r.execution_id.clone()),
        ("Kind", r.kind.clone()),
        ("Tool", r.tool_name.clone()),
        ("Room", r.room_id.clone()),
        ("Assistant", r.assistant_id.clone()),
        ("Reason", Some(r.reason.as_str().to_string())),
        ("Attempts", Some(r.attempts.to_string())),
        ("Last error", Some(r.last_error.clone())),
        ("First attempt", r.first_attempt_at.clone()),
        ("Last attempt", r.last_attempt_at.clone()),
        ("Dead-lettered", Some(r.dead_lettered_at.clone())),
    ];
    let dl: String = fields.iter().map(|(k, v)| format!("<dt>{k}</dt><dd>{}</dd>", html::opt(v.as_deref()))).collect();
    let attempts: Vec<Vec<String>> = r
        .history
        .iter()
        .map(|a| {
            let a = serde_json::to_value(a).unwrap_or_default();
            let cell = |k: &str| match &a[k] {
                Value::Null => "—".to_string(),
                Value::String(s) => esc(s),
                v => esc(&v.to_string()),
            };
            vec![
                cell("attempt"),
                cell("started_at"),
                cell("http_status"),
                cell("outcome"),
                cell("error"),
                cell("duration_ms"),
            ]
        })
        .collect();
    let job = r
        .job
        .as_ref()
        .map(|j| format!("<h2>Job (secrets redacted)</h2>{}", html::json_block(&redact(j))))
        .unwrap_or_default();
    let raw = r
        .raw_body
        .as_ref()
        .map(|b| format!("<h2>Body as it arrived (excerpt)</h2><pre>{}</pre>", esc(b)))
        .unwrap_or_default();
    let path = format!("/console/dead-letters/{}", url(id));
    let actions = format!(
        "{}{}",
        html::button(viewer, &format!("{path}/retry"), "Retry", "primary"),
        html::button(viewer, &format!("{path}/delete"), "Delete", "danger")
    );
    let edit = match (&r.job, viewer.can_change) {
        (Some(job), true) if job.get("parameters").is_some() => format!(
            "<h2>Retry with edited parameters</h2><form method=\"post\" action=\"{path}/retry-edited\">{}<textarea name=\"parameters\" rows=\"8\" cols=\"80\">{}</textarea><br><button>Check and retry</button></form>",
            html::csrf_field(viewer.csrf),
            esc(&serde_json::to_string_pretty(&job["parameters"]).unwrap_or_default())
        ),
        _ => String::new(),
    };
    format!(
        "<dl>{dl}</dl><div class=\"actions\">{actions}</div><h2>Attempts</h2>{}{job}{raw}{edit}",
        html::table(&["#", "Started", "HTTP status", "LetterOutcome", "Error", "Duration (ms)"], &attempts)
    )
}

/// `GET /console/dead-letters/{id}`.
pub(crate) async fn detail(State(state): State<AppState>, op: Operator, Path(id): Path<String>) -> Response {
    let viewer = op.viewer();
    match state.store.dead_letters().get_dead_letter(&id).await {
        Ok(Some(r)) => Html(html::page(&format!("Dead letter {id}"), Some(&viewer), &detail_body(&viewer, &r, &id)))
            .into_response(),
        Ok(None) => fail(&viewer, "Dead letter", &format!("No dead letter {id:?} (retried, deleted or expired).")),
        Err(e) => session::unavailable(&e.to_string()),
    }
}

/// What an outcome of a retry or delete says to the operator.
fn outcome_text(id: &str, action: Action, outcome: &LetterOutcome) -> (String, bool) {
    match (action, outcome) {
        (Action::Retry, LetterOutcome::Done) => (format!("{id} is back on the work queue."), true),
        (Action::Delete, LetterOutcome::Done) => (format!("{id} is deleted."), true),
        (_, LetterOutcome::NotReplayable) => (format!("{id} is a poison message: there is no job to retry."), false),
        (_, LetterOutcome::Superseded(s)) => {
            (format!("{id}'s execution is {} now; nothing was retried.", s.as_str()), false)
        }
        (_, LetterOutcome::Busy) => (format!("{id} is being acted on by another request; try again."), false),
        (_, LetterOutcome::NotFound) => (format!("No dead letter {id:?}."), false),
    }
}

pub(crate) async fn act(state: &AppState, op: &Operator, id: &str, action: Action, detail: Option<&Value>) -> Response {
    let viewer = op.viewer();
    let redrive_publisher = match action {
        Action::Retry => match state.broker.publisher() {
            Ok(p) => Some(p),
            Err(e) => return fail(&viewer, "Retry", &format!("the broker is unavailable: {e:?}")),
        },
        Action::Delete => None,
    };
    let redrive = redrive_publisher
        .as_ref()
        .map(|publisher| dead_letters::Redrive { publisher, topology: &state.config.common.topology });
    let outcome = match dead_letters::act_on(&state.store, redrive.as_ref(), id, action).await {
        Ok(o) => o,
        Err(e) => return fail(&viewer, "Dead letter", &format!("the operation failed: {e}")),
    };
    if matches!(outcome, LetterOutcome::Done) {
        let name = match (action, detail.is_some()) {
            (Action::Retry, false) => "dead_letter.retry",
            (Action::Retry, true) => "dead_letter.retry_edited",
            (Action::Delete, _) => "dead_letter.delete",
        };
        console::audit(state, &op.actor, name, id, 1, detail).await;
    }
    let (text, ok) = outcome_text(id, action, &outcome);
    let link = if ok && action == Action::Retry {
        html::link(&format!("/console/executions/{}", url(id)), "Follow the execution →")
    } else {
        html::link("/console/dead-letters", "← Dead letters")
    };
    console::outcome(&viewer, "Dead letter", &text, ok, &link)
}

/// `POST /console/dead-letters/{id}/retry`.
pub(crate) async fn retry(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Change { op, .. }: Change,
) -> Response {
    act(&state, &op, &id, Action::Retry, None).await
}

/// `POST /console/dead-letters/{id}/delete`.
pub(crate) async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Change { op, .. }: Change,
) -> Response {
    act(&state, &op, &id, Action::Delete, None).await
}

/// Retry with edited parameters: checked against the tool's schema, written into the dead
/// letter's job, then retried; the audit log keeps the parameters before and after.
pub(crate) async fn retry_edited(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Change { op, form }: Change,
) -> Response {
    let viewer = op.viewer();
    let parsed: Result<Value, _> = serde_json::from_str(form.get("parameters").map(String::as_str).unwrap_or_default());
    let Ok(Value::Object(params)) = parsed else {
        return fail(&viewer, "Retry with edited parameters", "parameters must be a JSON object");
    };
    let mut record = match state.store.dead_letters().get_dead_letter(&id).await {
        Ok(Some(r)) => r,
        Ok(None) => return fail(&viewer, "Retry with edited parameters", &format!("No dead letter {id:?}.")),
        Err(e) => return session::unavailable(&e.to_string()),
    };
    let (Some(job), Some(tool)) = (record.job.as_mut(), record.tool_name.clone()) else {
        return fail(&viewer, "Retry with edited parameters", "this dead letter has no tool call to edit");
    };
    if let Err(e) = crate::tool_schemas::check_call(&state.tool_schemas, state.store.registry(), &tool, &params).await {
        return fail(
            &viewer,
            "Retry with edited parameters",
            &format!("the parameters do not fit {tool}'s schema: {}", e.message),
        );
    }
    let before = job.get("parameters").cloned().unwrap_or(Value::Null);
    job["parameters"] = Value::Object(params.clone());
    let at =
        fleet_protocol::timefmt::millis_from_rfc3339(&record.dead_lettered_at).unwrap_or_else(fleet_platform::now_ms);
    if let Err(e) = state.store.dead_letters().save_dead_letter(&id, &record, at).await {
        return session::unavailable(&e.to_string());
    }
    let detail = json!({"parameters_before": redact(&before), "parameters_after": redact(&Value::Object(params))});
    act(&state, &op, &id, Action::Retry, Some(&detail)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_and_token_counts_are_not() {
        let job = json!({"api_key": "k", "nested": {"Authorization": "Bearer x", "refresh_token": "t"},
            "usage": {"prompt_tokens": 12, "completion_tokens": 3, "max_tokens": 9}, "query": "q"});
        let shown = redact(&job);
        assert_eq!(shown["api_key"], "[redacted]");
        assert_eq!(shown["nested"]["Authorization"], "[redacted]");
        assert_eq!(shown["nested"]["refresh_token"], "[redacted]");
        assert_eq!(shown["usage"], json!({"prompt_tokens": 12, "completion_tokens": 3, "max_tokens": 9}));
        assert_eq!(shown["query"], "q");
    }
}
