//! Steady load for the failover tests: tool calls enqueued at a fixed rate (each request on its own
//! task, so a stalled answer does not slow the rate), every answer recorded; and the figures of an
//! event (a node lost, restarted, cut off) computed from those records and the receiver's log, as
//! pure functions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::task::JoinSet;

use futures::StreamExt;

use crate::{Fleet, Receiver};

/// One `POST /v1/tool-calls` and its answer (`status` 0: no HTTP answer at all).
#[derive(Debug, Clone)]
pub struct Enqueue {
    pub sent: Instant,
    pub answered: Instant,
    pub status: u16,
    pub execution_id: Option<String>,
    /// The error code of a refusal (`broker_unavailable`, `outcome_unknown`, …).
    pub code: Option<String>,
}

impl Enqueue {
    pub fn accepted(&self) -> bool {
        self.status == 202
    }
}

pub struct Load {
    records: Arc<Mutex<Vec<Enqueue>>>,
    offered: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    /// Enqueues calls of `tool` at `per_second` until stopped.
    pub fn start(fleet: Arc<Fleet>, tool: &str, per_second: f64) -> Self {
        let records = Arc::new(Mutex::new(Vec::new()));
        let offered = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let (records, offered, stop, tool) = (records.clone(), offered.clone(), stop.clone(), tool.to_string());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut requests = JoinSet::new();
                while !stop.load(Ordering::SeqCst) {
                    tick.tick().await;
                    let n = offered.fetch_add(1, Ordering::SeqCst);
                    let (fleet, records, tool) = (fleet.clone(), records.clone(), tool.clone());
                    requests.spawn(async move {
                        let record = enqueue(&fleet, &tool, n).await;
                        records.lock().unwrap().push(record);
                    });
                    while requests.try_join_next().is_some() {}
                }
                while requests.join_next().await.is_some() {}
            })
        };
        Load { records, offered, stop, task }
    }

    /// Requests sent so far.
    pub fn offered(&self) -> usize {
        self.offered.load(Ordering::SeqCst)
    }

    /// Requests answered 202 so far.
    pub fn accepted(&self) -> usize {
        self.records.lock().unwrap().iter().filter(|r| r.accepted()).count()
    }

    /// The answers so far.
    pub fn records(&self) -> Vec<Enqueue> {
        self.records.lock().unwrap().clone()
    }

    /// Stops sending, waits for every answer, returns them all.
    pub async fn stop(self) -> Vec<Enqueue> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap();
        let records = self.records.lock().unwrap().clone();
        records
    }
}

async fn enqueue(fleet: &Fleet, tool: &str, n: usize) -> Enqueue {
    let sent = Instant::now();
    let body = json!({"tool_name": tool, "parameters": {"query": "load", "n": n}});
    let resp =
        fleet.http.post(format!("{}/v1/tool-calls", fleet.api)).bearer_auth(&fleet.token).json(&body).send().await;
    let (status, body) = match resp {
        Ok(r) => (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null)),
        Err(_) => (0, Value::Null),
    };
    let execution_id =
        body["data"]["execution_id"].as_str().or_else(|| body["error"]["execution_id"].as_str()).map(str::to_string);
    let code = body["error"]["code"].as_str().map(str::to_string);
    Enqueue { sent, answered: Instant::now(), status, execution_id, code }
}

/// Each execution's last callback at the receiver (a job called twice is done at the second).
pub fn last_callbacks(receiver: &Receiver) -> HashMap<String, Instant> {
    let mut last: HashMap<String, Instant> = HashMap::new();
    for r in receiver.received() {
        let at = last.entry(r.execution_id().to_string()).or_insert(r.at);
        *at = (*at).max(r.at);
    }
    last
}

/// How a run ended: what was accepted and lost, and which executions reached the receiver twice.
#[derive(Debug)]
pub struct Tally {
    pub offered: usize,
    pub accepted: usize,
    pub refused: usize,
    /// Accepted executions that did not end `succeeded` with a callback.
    pub lost: Vec<String>,
    /// Executions whose callback reached the receiver more than once, with the count.
    pub doubled: Vec<(String, usize)>,
    /// Refused `outcome_unknown` whose job ran anyway (the 503 said it might).
    pub unknown_ran: usize,
    /// When each accepted execution was finished: its last callback, or, for one still not
    /// `succeeded` when the load stopped, when it was first seen `succeeded`.
    pub finished: HashMap<String, Instant>,
}

/// Waits (up to `timeout`) until every accepted execution is `succeeded`, then counts.
pub async fn tally(fleet: &Fleet, receiver: &Receiver, records: &[Enqueue], timeout: Duration) -> Tally {
    let accepted: Vec<String> =
        records.iter().filter(|r| r.accepted()).filter_map(|r| r.execution_id.clone()).collect();
    let mut seen_late: HashMap<String, Instant> = HashMap::new();
    let mut pending = accepted.clone();
    let deadline = Instant::now() + timeout;
    let mut first_pass = true;
    loop {
        let statuses = statuses(fleet, pending.clone()).await;
        pending = vec![];
        for (id, status) in statuses {
            if status != "succeeded" {
                pending.push(id);
            } else if !first_pass {
                seen_late.insert(id, Instant::now());
            }
        }
        first_pass = false;
        if pending.is_empty() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lost: Vec<String> =
        accepted.iter().filter(|id| pending.contains(id) || receiver.side_effects(id) == 0).cloned().collect();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for r in receiver.received() {
        *counts.entry(r.execution_id().to_string()).or_default() += 1;
    }
    let unknown_ran = records
        .iter()
        .filter(|r| r.code.as_deref() == Some("outcome_unknown"))
        .filter_map(|r| r.execution_id.as_ref())
        .filter(|id| counts.contains_key(*id))
        .count();
    let doubled = counts.into_iter().filter(|(_, n)| *n > 1).collect();
    // Read after the statuses: a callback that landed while they were read counts too.
    let callbacks = last_callbacks(receiver);
    let finished = accepted
        .iter()
        .filter_map(|id| seen_late.get(id).or_else(|| callbacks.get(id)).map(|at| (id.clone(), *at)))
        .collect();
    Tally {
        offered: records.len(),
        accepted: accepted.len(),
        refused: records.len() - accepted.len(),
        lost,
        doubled,
        unknown_ran,
        finished,
    }
}

async fn statuses(fleet: &Fleet, ids: Vec<String>) -> Vec<(String, String)> {
    futures::stream::iter(ids)
        .map(|id| async move {
            let (_, body) = fleet.get(&format!("/v1/executions/{id}")).await;
            let status = body["data"]["status"].as_str().unwrap_or("missing").to_string();
            (id, status)
        })
        .buffer_unordered(32)
        .collect()
        .await
}

/// A run's tally and each event's figures.
pub struct Report {
    pub tally: Tally,
    pub events: Vec<(String, EventFigures)>,
}

/// Ends a run: lets the load go on until it offered `jobs`, stops it, tallies, and prints one line
/// for the run and one per event (`events`: each event's name and start, in order).
pub async fn report(
    title: &str,
    fleet: &Fleet,
    receiver: &Receiver,
    load: Load,
    events: Vec<(String, Instant)>,
    jobs: usize,
) -> Report {
    crate::wait_for("the load to offer its jobs", Duration::from_secs(300), || async {
        (load.offered() >= jobs).then_some(())
    })
    .await;
    let records = load.stop().await;
    let end = Instant::now();
    let tally = tally(fleet, receiver, &records, Duration::from_secs(180)).await;
    let mut calls: Vec<Instant> = receiver.received().iter().map(|r| r.at).collect();
    calls.sort();
    println!(
        "{title}: {} offered, {} accepted, {} refused, lost {}, doubled {}, outcome_unknown that ran anyway {}",
        tally.offered,
        tally.accepted,
        tally.refused,
        tally.lost.len(),
        tally.doubled.len(),
        tally.unknown_ran
    );
    let mut figures = vec![];
    for (i, (name, start)) in events.iter().enumerate() {
        let window_end = events.get(i + 1).map_or(end, |(_, next)| *next);
        let window = Window { name: name.clone(), start: *start, end: window_end };
        let f = event_figures(&records, &tally.finished, &calls, &window);
        println!("  {}", describe(name, &f));
        figures.push((name.clone(), f));
    }
    Report { tally, events: figures }
}

impl Report {
    /// Events the fleet did not recover from (accepting and draining again) within their window.
    pub fn unrecovered(&self) -> Vec<&str> {
        self.events
            .iter()
            .filter(|(_, f)| f.accepting_again.is_none() || f.drained_again.is_none())
            .map(|(name, _)| name.as_str())
            .collect()
    }
}

/// A stretch of the run: from an event's start to the next event's (or the end of the load).
#[derive(Debug, Clone)]
pub struct Window {
    pub name: String,
    pub start: Instant,
    pub end: Instant,
}

/// What one event did to the fleet.
#[derive(Debug, Clone, PartialEq)]
pub struct EventFigures {
    /// Enqueues sent in the window and refused (any answer but 202, or none).
    pub refused: usize,
    /// Of those, answered 503 `outcome_unknown` (the job may exist).
    pub unknown: usize,
    /// From the event's start until the first 202 to a request sent after the window's last
    /// refusal (with no refusal: the first 202 sent after the start). `None`: no 202 ever came.
    pub accepting_again: Option<Duration>,
    /// From the event's start until every job accepted by then (and not finished at the start)
    /// was finished. `None`: some never was.
    pub drained_again: Option<Duration>,
    /// The longest stretch in the window without any callback reaching the receiver.
    pub longest_pause: Duration,
}

/// The figures of `window`, given every enqueue, when each accepted execution was finished, and
/// every callback's time (sorted).
pub fn event_figures(
    enqueues: &[Enqueue],
    finished: &HashMap<String, Instant>,
    callbacks: &[Instant],
    window: &Window,
) -> EventFigures {
    let inside: Vec<&Enqueue> = enqueues.iter().filter(|e| e.sent >= window.start && e.sent < window.end).collect();
    let refusals: Vec<&&Enqueue> = inside.iter().filter(|e| !e.accepted()).collect();
    let unknown = refusals.iter().filter(|e| e.code.as_deref() == Some("outcome_unknown")).count();
    let last_refusal = refusals.iter().map(|e| e.sent).max().unwrap_or(window.start);
    // A refusal late in the window is followed by a 202 in the next one: look past the window.
    let accepting_again = enqueues
        .iter()
        .filter(|e| e.accepted() && e.sent >= last_refusal)
        .map(|e| e.answered)
        .min()
        .map(|t| t.saturating_duration_since(window.start));
    let recovered = window.start + accepting_again.unwrap_or(window.end - window.start);
    let owed: Vec<Option<&Instant>> = enqueues
        .iter()
        .filter(|e| e.accepted() && e.answered <= recovered)
        .filter_map(|e| e.execution_id.as_ref())
        .map(|id| finished.get(id))
        .filter(|at| at.is_none_or(|t| *t >= window.start))
        .collect();
    let drained_again = if owed.iter().any(Option::is_none) {
        None
    } else {
        Some(owed.iter().flatten().map(|t| t.saturating_duration_since(window.start)).max().unwrap_or_default())
    };
    let mut longest_pause = Duration::ZERO;
    let mut previous = window.start;
    let inside_calls = callbacks.iter().copied().filter(|t| *t >= window.start && *t < window.end);
    for t in inside_calls.chain(std::iter::once(window.end)) {
        longest_pause = longest_pause.max(t - previous);
        previous = t;
    }
    EventFigures { refused: refusals.len(), unknown, accepting_again, drained_again, longest_pause }
}

/// `figures` as one line of the run's report.
pub fn describe(name: &str, f: &EventFigures) -> String {
    let secs = |d: Option<Duration>| d.map_or("never".to_string(), |d| format!("{:.1} s", d.as_secs_f64()));
    format!(
        "{name}: refused {} (outcome_unknown {}), accepting again after {}, drained again after {}, longest pause in callbacks {:.1} s",
        f.refused,
        f.unknown,
        secs(f.accepting_again),
        secs(f.drained_again),
        f.longest_pause.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(calls: &HashMap<String, Instant>) -> Vec<Instant> {
        let mut all: Vec<Instant> = calls.values().copied().collect();
        all.sort();
        all
    }

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn enqueue(base: Instant, sent: u64, answered: u64, status: u16, id: &str) -> Enqueue {
        Enqueue {
            sent: at(base, sent),
            answered: at(base, answered),
            status,
            execution_id: Some(id.into()),
            code: (status == 503).then(|| "broker_unavailable".to_string()),
        }
    }

    #[test]
    fn an_outage_counts_its_refusals_and_when_jobs_are_accepted_and_worked_again() {
        let base = Instant::now();
        let window = Window { name: "kill".into(), start: at(base, 1000), end: at(base, 10_000) };
        let enqueues = vec![
            enqueue(base, 900, 950, 202, "before"), // accepted before, called back during the outage
            enqueue(base, 1100, 1150, 503, "r1"),
            enqueue(base, 2000, 2100, 202, "between"), // a 202 between refusals does not count
            enqueue(base, 3000, 3050, 503, "r2"),
            enqueue(base, 3500, 3600, 202, "after"),
            enqueue(base, 4000, 4010, 202, "later"),
        ];
        let calls: HashMap<String, Instant> = [("before", 4200), ("between", 4300), ("after", 4500), ("later", 4100)]
            .into_iter()
            .map(|(id, ms)| (id.to_string(), at(base, ms)))
            .collect();
        let f = event_figures(&enqueues, &calls, &sorted(&calls), &window);
        assert_eq!(f.refused, 2);
        assert_eq!(f.unknown, 0);
        assert_eq!(f.accepting_again, Some(Duration::from_millis(2600)));
        // Owed: before, between, after (accepted by 3.6 s); the last callback at 4.5 s. "later"
        // was accepted after recovery and does not count.
        assert_eq!(f.drained_again, Some(Duration::from_millis(3500)));
        // Callbacks in the window at 4.1, 4.2, 4.3, 4.5 s: the longest pause is the end (10 s) - 4.5 s.
        assert_eq!(f.longest_pause, Duration::from_millis(5500));
    }

    #[test]
    fn a_quiet_event_has_no_refusal_and_recovers_at_its_first_answer() {
        let base = Instant::now();
        let window = Window { name: "restart".into(), start: at(base, 0), end: at(base, 1000) };
        let enqueues = vec![enqueue(base, 10, 20, 202, "a"), enqueue(base, 500, 510, 202, "b")];
        let calls: HashMap<String, Instant> =
            [("a".to_string(), at(base, 60)), ("b".to_string(), at(base, 560))].into_iter().collect();
        let f = event_figures(&enqueues, &calls, &sorted(&calls), &window);
        assert_eq!((f.refused, f.accepting_again), (0, Some(Duration::from_millis(20))));
        assert_eq!(f.drained_again, Some(Duration::from_millis(60)));
        assert_eq!(f.longest_pause, Duration::from_millis(500));
    }

    #[test]
    fn an_accepted_job_never_called_back_means_never_drained() {
        let base = Instant::now();
        let window = Window { name: "lost".into(), start: at(base, 0), end: at(base, 1000) };
        let enqueues = vec![enqueue(base, 10, 20, 202, "a")];
        let f = event_figures(&enqueues, &HashMap::new(), &[], &window);
        assert_eq!(f.drained_again, None);
        let no_answer = vec![enqueue(base, 10, 20, 503, "a")];
        assert_eq!(event_figures(&no_answer, &HashMap::new(), &[], &window).accepting_again, None);
    }
}
