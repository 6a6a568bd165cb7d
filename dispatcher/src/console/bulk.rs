//! Bulk operations on dead letters: a preview (how many match) before anything changes; a redrive
//! then runs in the background at a chosen rate, its progress kept in Redis (any dispatcher shows
//! it; the page refreshes itself); a purge asks for a typed confirmation naming the count.

use axum::extract::{Path, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde_json::json;

use fleet_platform::dead_letters::{self, Action, LetterOutcome};
use fleet_protocol::dead_letters::DeadLetterFilter;

use crate::console::dead_letters::{scan, Search};
use crate::console::html::{self, esc, url};
use crate::console::session::{self, Change, Operator};
use crate::console::{self, fail, outcome, Params};
use crate::AppState;

/// How long a redrive's progress stays readable.
const JOB_TTL_SECS: u64 = 24 * 3600;
/// The most a preview reads when the counts kept in Redis cannot answer (a search or a time
/// range): beyond it, the preview says "at least".
const PREVIEW_SCAN_BUDGET: usize = 2_000;

/// The ids of every dead letter the search matches, newest first (reads the whole store: only
/// an action, never a preview, calls it).
async fn matching_ids(state: &AppState, search: &Search) -> Result<Vec<String>, fleet_platform::store::StoreError> {
    let s = scan(state, search, None, usize::MAX, usize::MAX).await?;
    Ok(s.found.into_iter().filter_map(|r| r.execution_id).collect())
}

/// How many dead letters a preview says match: exactly, or at least.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Count {
    pub n: u64,
    pub exact: bool,
}

impl Count {
    fn lead(&self) -> &'static str {
        if self.exact {
            ""
        } else {
            "at least "
        }
    }
}

/// Whether the counts kept in Redis answer this search: no substring, no time range.
pub(crate) fn counted(search: &Search) -> bool {
    search.q.is_none() && search.filter.since.is_none() && search.filter.until.is_none()
}

/// The preview's count: from the counts per reason and tool when they answer, else from a scan
/// bounded by `PREVIEW_SCAN_BUDGET` (a lower bound when it stopped short).
pub(crate) async fn preview_count(
    state: &AppState,
    search: &Search,
) -> Result<Count, fleet_platform::store::StoreError> {
    if counted(search) {
        let reason = search.filter.reason.map(|r| r.as_str());
        if let Some(n) =
            state.store.dead_letters().count_dead_letters_by(reason, search.filter.tool_name.as_deref()).await?
        {
            return Ok(Count { n, exact: true });
        }
    }
    let s = scan(state, search, None, usize::MAX, PREVIEW_SCAN_BUDGET).await?;
    Ok(Count { n: s.matched, exact: s.next.is_none() })
}

/// The confirmation a purge of what `c` counts asks to be typed.
pub(crate) fn purge_phrase(c: &Count) -> String {
    format!("purge {}{}", c.lead(), c.n)
}

/// The search a bulk operation's form names, or the page saying why it does not parse.
fn search(op: &Operator, form: &Params) -> Result<Search, Response> {
    Search::parse(form).map_err(|why| fail(&op.viewer(), "Dead letters", &why))
}

/// The form's search and how many dead letters it matches now (as a preview counts them).
async fn matched(state: &AppState, op: &Operator, form: &Params) -> Result<(Search, Count), Response> {
    let search = search(op, form)?;
    let c = preview_count(state, &search).await.map_err(|e| session::unavailable(&e.to_string()))?;
    Ok((search, c))
}

fn hidden(form: &Params) -> String {
    ["tool_name", "reason", "since", "until", "q"]
        .iter()
        .filter_map(|k| form.get(*k).map(|v| format!("<input type=\"hidden\" name=\"{k}\" value=\"{}\">", esc(v))))
        .collect()
}

/// `POST /console/dead-letters/redrive/preview`: how many match, and the form that starts it.
pub(crate) async fn redrive_preview(State(state): State<AppState>, Change { op, form }: Change) -> Response {
    let (search, c) = match matched(&state, &op, &form).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let (viewer, n, lead) = (op.viewer(), c.n, c.lead());
    let body = format!(
        "<p class=\"preview\">{lead}<b id=\"match-count\">{n}</b> dead letters match <code>{}</code>.</p>\
         <form method=\"post\" action=\"/console/dead-letters/redrive\">{}{}<label>Rate (per second) <input name=\"rate\" value=\"50\"></label>\
         <button class=\"primary\">Redrive {}</button></form><p>{}</p>",
        esc(&search.text()),
        html::csrf_field(viewer.csrf),
        hidden(&form),
        if c.exact { n.to_string() } else { "all that match".into() },
        html::link("/console/dead-letters", "Cancel")
    );
    Html(html::page("Redrive: preview", Some(&viewer), &body)).into_response()
}

/// `POST /console/dead-letters/redrive`: starts the redrive in the background.
pub(crate) async fn redrive(State(state): State<AppState>, Change { op, form }: Change) -> Response {
    let search = match search(&op, &form) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let rate: f64 = form.get("rate").and_then(|r| r.trim().parse().ok()).unwrap_or(50.0);
    if !(rate > 0.0 && rate <= 10_000.0) {
        return fail(&op.viewer(), "Redrive", "the rate must be between 0 and 10000 per second");
    }
    let job = format!("rd_{}", hex::encode(rand::random::<[u8; 8]>()));
    let fields = progress_fields(0, &BulkTally::default(), "counting", &search.text(), rate);
    if let Err(e) = state.store.console().console_job_put(&job, &fields, JOB_TTL_SECS).await {
        return session::unavailable(&e.to_string());
    }
    let (st, actor, id) = (state.clone(), op.actor.clone(), job.clone());
    state.console_tasks.spawn(async move {
        // Finding every match reads the whole store: done here, not while the operator waits.
        match matching_ids(&st, &search).await {
            Ok(ids) => run_redrive(st, actor, id, search, ids, rate).await,
            Err(e) => {
                let failed = progress_fields(0, &BulkTally::default(), &format!("failed: {e}"), &search.text(), rate);
                let _ = st.store.console().console_job_put(&id, &failed, JOB_TTL_SECS).await;
            }
        }
    });
    Redirect::to(&format!("/console/jobs/{job}")).into_response()
}

#[derive(Default)]
struct BulkTally {
    done: u64,
    skipped: u64,
}

fn progress_fields(total: usize, t: &BulkTally, status: &str, target: &str, rate: f64) -> Vec<(&'static str, String)> {
    vec![
        ("total", total.to_string()),
        ("done", t.done.to_string()),
        ("skipped", t.skipped.to_string()),
        ("status", status.to_string()),
        ("target", target.to_string()),
        ("rate", rate.to_string()),
    ]
}

/// Retries each id at `rate`, writing progress every few retries; stops early at shutdown (what
/// is left stays dead-lettered, to be redriven again).
async fn run_redrive(state: AppState, actor: String, job: String, search: Search, ids: Vec<String>, rate: f64) {
    let pause = std::time::Duration::from_secs_f64(1.0 / rate);
    let mut tally = BulkTally::default();
    let mut status = "finished";
    let publisher = state.broker.publisher().ok();
    let redrive = publisher
        .as_ref()
        .map(|publisher| dead_letters::Redrive { publisher, topology: &state.config.common.topology });
    let mut tick = tokio::time::interval(pause);
    for (n, id) in ids.iter().enumerate() {
        tokio::select! {
            _ = tick.tick() => {}
            _ = state.shutdown.cancelled() => { status = "stopped (shutdown)"; break; }
        }
        match dead_letters::act_on(&state.store, redrive.as_ref(), id, Action::Retry).await {
            Ok(LetterOutcome::Done) => tally.done += 1,
            _ => tally.skipped += 1,
        }
        if n % 10 == 9 {
            let _ = state
                .store
                .console()
                .console_job_put(
                    &job,
                    &progress_fields(ids.len(), &tally, "running", &search.text(), rate),
                    JOB_TTL_SECS,
                )
                .await;
        }
    }
    let _ = state
        .store
        .console()
        .console_job_put(&job, &progress_fields(ids.len(), &tally, status, &search.text(), rate), JOB_TTL_SECS)
        .await;
    let detail = json!({"job": job, "matched": ids.len(), "skipped": tally.skipped, "rate_per_second": rate});
    let target = search.text();
    console::audit(&state, &actor, "dead_letters.redrive", &target, tally.done, Some(&detail)).await;
}

/// `GET /console/jobs/{id}`: a redrive's progress (the page refreshes itself while it runs).
pub(crate) async fn job(State(state): State<AppState>, op: Operator, Path(id): Path<String>) -> Response {
    let viewer = op.viewer();
    let fields = match state.store.console().console_job(&id).await {
        Ok(f) if !f.is_empty() => f,
        Ok(_) => return fail(&viewer, "Redrive", &format!("No redrive {id:?} (it finished more than a day ago?)")),
        Err(e) => return session::unavailable(&e.to_string()),
    };
    let get = |k: &str| fields.get(k).cloned().unwrap_or_default();
    let (total, done, skipped): (u64, u64, u64) =
        (get("total").parse().unwrap_or(0), get("done").parse().unwrap_or(0), get("skipped").parse().unwrap_or(0));
    let running = matches!(get("status").as_str(), "running" | "counting");
    let body = format!(
        "{}<p>Redriving <code>{}</code> at {}/s: <span id=\"job-status\">{}</span></p>\
         <progress id=\"job-progress\" max=\"{total}\" value=\"{}\"></progress>\
         <p><b id=\"job-done\">{done}</b> of {total} back on the work queue; {skipped} skipped (gone, busy or poison).</p><p>{}</p>",
        if running { "<meta http-equiv=\"refresh\" content=\"1\">" } else { "" },
        esc(&get("target")),
        esc(&get("rate")),
        esc(&get("status")),
        done + skipped,
        html::link("/console/dead-letters", "← Dead letters")
    );
    Html(html::page("Redrive", Some(&viewer), &body)).into_response()
}

/// `POST /console/dead-letters/purge/preview`: the count and the typed confirmation.
pub(crate) async fn purge_preview(State(state): State<AppState>, Change { op, form }: Change) -> Response {
    let (search, c) = match matched(&state, &op, &form).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let (viewer, n, lead) = (op.viewer(), c.n, c.lead());
    let phrase = purge_phrase(&c);
    let body = format!(
        "<p class=\"preview\">{lead}<b id=\"match-count\">{n}</b> dead letters match <code>{}</code>. Purging deletes them for good.</p>\
         <form method=\"post\" action=\"/console/dead-letters/purge\">{}{}<label>Type <code>{phrase}</code> to confirm <input name=\"confirm\" autocomplete=\"off\"></label>\
         <button class=\"danger\">Purge</button></form><p>{}</p>",
        esc(&search.text()),
        html::csrf_field(viewer.csrf),
        hidden(&form),
        html::link("/console/dead-letters", "Cancel")
    );
    Html(html::page("Purge: preview", Some(&viewer), &body)).into_response()
}

/// `POST /console/dead-letters/purge`: deletes what matches, if the confirmation names its count.
pub(crate) async fn purge(State(state): State<AppState>, Change { op, form }: Change) -> Response {
    let (search, c) = match matched(&state, &op, &form).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let viewer = op.viewer();
    let typed = form.get("confirm").map(|c| c.trim()).unwrap_or_default();
    if typed != purge_phrase(&c) {
        let why = format!("Nothing purged: type {:?} exactly ({}{} match now).", purge_phrase(&c), c.lead(), c.n);
        return fail(&viewer, "Purge", &why);
    }
    // The confirmation names the count; deleting needs every matching id.
    let ids = match matching_ids(&state, &search).await {
        Ok(ids) => ids,
        Err(e) => return session::unavailable(&e.to_string()),
    };
    let filter = DeadLetterFilter { execution_ids: ids.clone(), ..Default::default() };
    let report = match dead_letters::apply(&state.store, None, &filter, Action::Delete, None, None).await {
        Ok(r) => r,
        Err(e) => return fail(&viewer, "Purge", &format!("the purge failed: {e}")),
    };
    let target = search.text();
    let detail = serde_json::to_value(&report).unwrap_or_default();
    console::audit(&state, &op.actor, "dead_letters.purge", &target, report.done, Some(&detail)).await;
    let text = format!("{} dead letters purged.", report.done);
    let back = html::link(&format!("/console/dead-letters?q={}", url("")), "← Dead letters");
    outcome(&viewer, "Purge", &text, true, &back)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_phrase_says_when_the_count_is_a_lower_bound() {
        assert_eq!(purge_phrase(&Count { n: 37, exact: true }), "purge 37");
        assert_eq!(purge_phrase(&Count { n: 2000, exact: false }), "purge at least 2000");
    }

    #[test]
    fn only_reason_and_tool_filters_are_answered_from_the_counts() {
        let p = |pairs: &[(&str, &str)]| {
            Search::parse(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()).unwrap()
        };
        assert!(counted(&p(&[])));
        assert!(counted(&p(&[("reason", "poison"), ("tool_name", "t")])));
        assert!(!counted(&p(&[("q", "room_1")])));
        assert!(!counted(&p(&[("since", "2026-01-01T00:00:00Z")])));
    }
}
