//! The fleet's recent activity as the console's overview shows it: per job kind, how many jobs
//! succeeded, failed (an attempt to be retried) or were dead-lettered in the last minute and the
//! last 15, and how many run on a worker now. Workers count in memory (their
//! `fleet_jobs_finished_total` counters) and report how far the counters moved every few seconds,
//! into ten-second buckets, with what they run now: nothing is written per job.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

/// The width of one bucket of finished jobs (s).
pub const BUCKET_SECS: i64 = 10;
/// How often a worker reports (s).
pub const REPORT_EVERY_SECS: u64 = 5;
/// The buckets of the last 15 minutes, the current one included.
pub const WINDOW_BUCKETS: i64 = 15 * 60 / BUCKET_SECS + 1;
/// The buckets of the last minute, the current one included (so 60 to 70 s of history).
pub const MINUTE_BUCKETS: i64 = 60 / BUCKET_SECS + 1;
/// How long a bucket is kept (s): past the window, so a slow reader still finds it.
pub const BUCKET_TTL_SECS: u64 = 20 * 60;
/// A worker whose last report is older than this (ms) is gone: what it ran counts for nothing.
pub const STALE_AFTER_MS: i64 = 30_000;

/// What a finished job counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tally {
    Succeeded,
    /// An attempt failed and another is scheduled.
    Failed,
    DeadLettered,
}

impl Tally {
    pub const ALL: [Tally; 3] = [Tally::Succeeded, Tally::Failed, Tally::DeadLettered];

    pub fn as_str(self) -> &'static str {
        match self {
            Tally::Succeeded => "succeeded",
            Tally::Failed => "failed",
            Tally::DeadLettered => "dead_lettered",
        }
    }

    /// What an `outcome` of `fleet_jobs_finished_total` counts as: none for a copy, a park, a
    /// poll, a cancel and the like.
    pub fn of_outcome(outcome: &str) -> Option<Tally> {
        match outcome {
            "success" => Some(Tally::Succeeded),
            "retry" => Some(Tally::Failed),
            "permanent" | "dead_letter" | "poison" | "delivery_limit" => Some(Tally::DeadLettered),
            _ => None,
        }
    }
}

/// The bucket (its start, s) that `at_ms` falls in.
pub fn bucket_of(at_ms: i64) -> i64 {
    at_ms.div_euclid(BUCKET_SECS * 1000) * BUCKET_SECS
}

/// The buckets of the last 15 minutes at `now_ms`, newest first.
pub fn window(now_ms: i64) -> Vec<i64> {
    let newest = bucket_of(now_ms);
    (0..WINDOW_BUCKETS).map(|i| newest - i * BUCKET_SECS).collect()
}

/// A bucket's field for one kind and tally.
pub fn field(kind: &str, tally: Tally) -> String {
    format!("{kind}:{}", tally.as_str())
}

/// A worker's finished-job counters, by kind and outcome.
pub type Counters = BTreeMap<(String, String), u64>;

/// How far the counters moved since `before`, as a bucket's fields (kinds and tallies that did
/// not move are left out).
pub fn moved(before: &Counters, now: &Counters) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for ((kind, outcome), n) in now {
        let Some(tally) = Tally::of_outcome(outcome) else { continue };
        let was = before.get(&(kind.clone(), outcome.clone())).copied().unwrap_or(0);
        if *n > was {
            *out.entry(field(kind, tally)).or_insert(0) += n - was;
        }
    }
    out
}

/// What a worker runs now, as it reports it: `kind=n` pairs (kinds with none left out).
pub fn encode_running(running: &[(&str, i64)]) -> String {
    running.iter().filter(|(_, n)| *n > 0).map(|(k, n)| format!("{k}={n}")).collect::<Vec<_>>().join(",")
}

fn decode_running(text: &str) -> impl Iterator<Item = (&str, i64)> {
    text.split(',').filter_map(|pair| pair.split_once('=')).filter_map(|(k, n)| Some((k, n.parse().ok()?)))
}

/// Finished jobs of one kind in a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub succeeded: u64,
    pub failed: u64,
    pub dead_lettered: u64,
}

impl Counts {
    fn add(&mut self, tally: Tally, n: u64) {
        match tally {
            Tally::Succeeded => self.succeeded += n,
            Tally::Failed => self.failed += n,
            Tally::DeadLettered => self.dead_lettered += n,
        }
    }
}

/// One kind's activity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct KindActivity {
    /// Jobs running on a live worker now.
    pub running: i64,
    pub last_minute: Counts,
    pub last_15_minutes: Counts,
}

/// Sums the buckets read at `now_ms` (start, fields) and the live workers' running reports into
/// each kind's activity. A bucket outside the window counts for nothing.
pub fn summarize(
    now_ms: i64,
    buckets: &[(i64, HashMap<String, u64>)],
    running: &[String],
) -> BTreeMap<String, KindActivity> {
    let newest = bucket_of(now_ms);
    let mut out: BTreeMap<String, KindActivity> = BTreeMap::new();
    for (start, fields) in buckets {
        let age = (newest - start) / BUCKET_SECS;
        if !(0..WINDOW_BUCKETS).contains(&age) {
            continue;
        }
        for (name, n) in fields {
            let Some((kind, tally)) = name.rsplit_once(':') else { continue };
            let Some(tally) = Tally::ALL.into_iter().find(|t| t.as_str() == tally) else { continue };
            let entry = out.entry(kind.to_string()).or_default();
            entry.last_15_minutes.add(tally, *n);
            if age < MINUTE_BUCKETS {
                entry.last_minute.add(tally, *n);
            }
        }
    }
    for report in running {
        for (kind, n) in decode_running(report) {
            out.entry(kind.to_string()).or_default().running += n;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(pairs: &[(&str, &str, u64)]) -> Counters {
        pairs.iter().map(|(k, o, n)| ((k.to_string(), o.to_string()), *n)).collect()
    }

    #[test]
    fn outcomes_count_as_succeeded_failed_or_dead_lettered_or_not_at_all() {
        assert_eq!(Tally::of_outcome("success"), Some(Tally::Succeeded));
        assert_eq!(Tally::of_outcome("retry"), Some(Tally::Failed));
        for dead in ["permanent", "dead_letter", "poison", "delivery_limit"] {
            assert_eq!(Tally::of_outcome(dead), Some(Tally::DeadLettered), "{dead}");
        }
        for none in ["copy", "deferred", "polling", "fenced", "duplicate", "cancelled", "owed"] {
            assert_eq!(Tally::of_outcome(none), None, "{none}");
        }
    }

    #[test]
    fn a_report_is_how_far_each_tally_moved() {
        let before = counters(&[("tool_call", "success", 5), ("tool_call", "retry", 1)]);
        let now = counters(&[
            ("tool_call", "success", 8),
            ("tool_call", "retry", 1),
            ("tool_call", "permanent", 2),
            ("tool_call", "dead_letter", 1),
            ("turn", "copy", 9),
        ]);
        let fields = moved(&before, &now);
        let expected: BTreeMap<String, u64> =
            [("tool_call:succeeded".to_string(), 3), ("tool_call:dead_lettered".to_string(), 3)].into();
        assert_eq!(fields, expected);
        assert!(moved(&now, &now).is_empty(), "nothing moved, nothing to write");
    }

    #[test]
    fn buckets_are_ten_seconds_and_the_window_fifteen_minutes() {
        assert_eq!(bucket_of(1_234_567), 1_230);
        assert_eq!(bucket_of(-1), -10);
        let w = window(1_234_567);
        assert_eq!((w.len(), w[0], w[1], *w.last().unwrap()), (91, 1_230, 1_220, 1_230 - 900));
    }

    #[test]
    fn the_last_minute_and_the_last_fifteen_are_summed_apart_and_running_per_kind() {
        let now = 10_000_000; // bucket 10_000
        let bucket = |start: i64, pairs: &[(&str, u64)]| {
            (start, pairs.iter().map(|(f, n)| (f.to_string(), *n)).collect::<HashMap<_, _>>())
        };
        let buckets = [
            bucket(10_000, &[("tool_call:succeeded", 2), ("tool_call:failed", 1)]),
            bucket(9_940, &[("tool_call:succeeded", 3)]),
            bucket(9_930, &[("tool_call:succeeded", 4), ("webhook:dead_lettered", 1)]),
            bucket(9_100, &[("tool_call:succeeded", 5)]),
            bucket(9_090, &[("tool_call:succeeded", 100)]),
            bucket(10_000, &[("nonsense", 7), ("turn:unknown", 7)]),
        ];
        let running = ["tool_call=2,turn=1".to_string(), "tool_call=3".to_string(), "garbage".to_string()];
        let shown = summarize(now, &buckets, &running);
        let calls = shown["tool_call"];
        assert_eq!(calls.running, 5);
        assert_eq!(calls.last_minute, Counts { succeeded: 5, failed: 1, dead_lettered: 0 });
        assert_eq!(calls.last_15_minutes, Counts { succeeded: 14, failed: 1, dead_lettered: 0 });
        assert_eq!(shown["webhook"].last_15_minutes.dead_lettered, 1);
        assert_eq!(shown["webhook"].last_minute.dead_lettered, 0);
        assert_eq!(shown["turn"].running, 1);
        assert_eq!(encode_running(&[("tool_call", 2), ("turn", 0), ("webhook", 1)]), "tool_call=2,webhook=1");
    }
}
