//! The worker's share of the console's activity view (`fleet_protocol::activity`): every few
//! seconds, how far its finished-job counters moved and how many jobs it runs now, in one script,
//! beside the jobs rather than on their path (a job only moves its in-memory counters).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use fleet_platform::metrics::Metrics;
use fleet_platform::now_ms;
use fleet_platform::store::{ActivityReport, Store};
use fleet_protocol::activity;
use fleet_protocol::envelope::JobKind;

fn running(metrics: &Metrics) -> String {
    let per_kind: Vec<(&str, i64)> = JobKind::ALL
        .iter()
        .map(|k| (k.as_str(), metrics.jobs_in_flight.with_label_values(&[k.as_str()]).get()))
        .collect();
    activity::encode_running(&per_kind)
}

/// Reports every `REPORT_EVERY_SECS` until `cancel`, then once more (what finished meanwhile) and
/// retires this worker's running report.
pub(crate) async fn report(store: Store, metrics: Metrics, worker_id: Arc<str>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(activity::REPORT_EVERY_SECS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reported = metrics.finished_counts();
    loop {
        let retiring = tokio::select! {
            _ = tick.tick() => false,
            _ = cancel.cancelled() => true,
        };
        let now = metrics.finished_counts();
        let report = ActivityReport {
            worker_id: &worker_id,
            running: if retiring { String::new() } else { running(&metrics) },
            finished: activity::moved(&reported, &now),
            retiring,
        };
        match store.console().report_activity(&report, now_ms()).await {
            // Counted as reported only once written; a failed write is carried to the next report.
            Ok(()) => reported = now,
            Err(e) => tracing::debug!(error = %e, "activity not reported"),
        }
        if retiring {
            return;
        }
    }
}
