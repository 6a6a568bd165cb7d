//! Queue gauges for Prometheus: messages and consumers on every fleet queue (passive declares),
//! and the age of the oldest job waiting in a work queue. Refreshed on an interval by the
//! dispatcher, so they exist even where the broker's own Prometheus plugin is not enabled.
//!
//! The oldest job's age costs no write per job: a work queue is first in, first out, so while it
//! holds jobs the oldest of them entered it no earlier than the newest job a worker picked up
//! (which workers note once a second); its age is at most the time since that job entered. An
//! empty queue's is 0; a queue no worker has taken from since the dispatcher started counts from
//! when the dispatcher first saw it holding jobs.

use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use tokio_util::sync::CancellationToken;

use fleet_platform::broker::BrokerLink;
use fleet_platform::metrics::Metrics;
use fleet_platform::now_ms;
use fleet_platform::store::Store;
use fleet_protocol::envelope::JobKind;
use fleet_protocol::topology::Topology;

/// Refreshes the gauges every `interval` until `cancel`.
pub async fn poll(
    link: BrokerLink,
    topology: Topology,
    store: Store,
    metrics: Metrics,
    interval: Duration,
    cancel: CancellationToken,
) {
    let mut circuits_shown = std::collections::BTreeSet::new();
    let mut waiting_since: std::collections::HashMap<JobKind, i64> = std::collections::HashMap::new();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.cancelled() => return,
        }
        let mut depths = std::collections::HashMap::new();
        if let Some(live) = link.current() {
            match refresh_queues(&live.connection, &topology, &metrics).await {
                Ok(d) => depths = d,
                Err(e) => tracing::debug!(error = %e, "queue stats unavailable"),
            }
        }
        // Retention applies even while no new dead letter arrives to trigger it.
        if let Err(e) = store.dead_letters().trim_dead_letters(now_ms()).await {
            tracing::debug!(error = %e, "dead-letter trimming skipped");
        }
        if let Ok(n) = store.dead_letters().count_dead_letters().await {
            metrics.dead_letters_stored.set(n as i64);
        }
        if let Err(e) = crate::circuit::refresh_gauge(&store, &metrics, &mut circuits_shown).await {
            tracing::debug!(error = %e, "open-circuit gauge not refreshed");
        }
        if depths.is_empty() {
            continue;
        }
        let Ok(pickups) = store.executions().pickups().await else { continue };
        let now = now_ms();
        for kind in JobKind::ALL {
            let depth: u32 = topology.waiting_queues(kind).iter().filter_map(|q| depths.get(q)).sum();
            let first_seen = *waiting_since.entry(kind).or_insert(now);
            if depth == 0 {
                waiting_since.remove(&kind);
            }
            let age = oldest_age_ms(depth, pickups.get(kind.as_str()).copied(), first_seen, now);
            metrics.oldest_job_age.with_label_values(&[kind.as_str()]).set(age as f64 / 1000.0);
        }
    }
}

/// The oldest waiting job's age (ms): 0 for an empty queue; else the time since the newest job a
/// worker picked up entered the queue (or, before any pickup, since the queue was seen holding
/// jobs), whichever is shorter.
fn oldest_age_ms(depth: u32, newest_pickup_ms: Option<i64>, first_seen_ms: i64, now_ms: i64) -> i64 {
    if depth == 0 {
        return 0;
    }
    let since = newest_pickup_ms.map_or(first_seen_ms, |p| p.max(first_seen_ms));
    (now_ms - since).max(0)
}

/// Refreshes every queue's gauges; returns the ready messages by queue name.
async fn refresh_queues(
    connection: &lapin::Connection,
    topology: &Topology,
    metrics: &Metrics,
) -> Result<std::collections::HashMap<String, u32>, lapin::Error> {
    // A passive declare of a missing queue closes its channel: one channel per pass, reopened on error.
    let mut channel = connection.create_channel().await?;
    let mut depths = std::collections::HashMap::new();
    for q in topology.queues() {
        let options = QueueDeclareOptions { passive: true, ..Default::default() };
        match channel.queue_declare(q.name.as_str().into(), options, FieldTable::default()).await {
            Ok(info) => {
                metrics.queue_messages.with_label_values(&[&q.name]).set(info.message_count() as i64);
                metrics.queue_consumers.with_label_values(&[&q.name]).set(info.consumer_count() as i64);
                depths.insert(q.name.clone(), info.message_count());
            }
            Err(_) => channel = connection.create_channel().await?,
        }
    }
    let _ = channel.close(200, "stats".into()).await;
    Ok(depths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_age_is_bounded_by_the_newest_pickup() {
        assert_eq!(oldest_age_ms(0, Some(1_000), 0, 9_000), 0, "an empty queue waits for nothing");
        assert_eq!(oldest_age_ms(5, Some(8_000), 0, 9_000), 1_000, "jobs behind a recent pickup are young");
        assert_eq!(oldest_age_ms(5, None, 4_000, 9_000), 5_000, "no pickup yet: since the queue was seen full");
        assert_eq!(oldest_age_ms(5, Some(1_000), 6_000, 9_000), 3_000, "a stale pickup from before the jobs came");
    }
}
