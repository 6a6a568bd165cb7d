//! Queue gauges for Prometheus: messages and consumers on every fleet queue (passive declares),
//! and the age of the oldest job not yet started. Refreshed on an interval by the dispatcher, so
//! they exist even where the broker's own Prometheus plugin is not enabled.

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
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.cancelled() => return,
        }
        if let Some(live) = link.current() {
            if let Err(e) = refresh_queues(&live.connection, &topology, &metrics).await {
                tracing::debug!(error = %e, "queue stats unavailable");
            }
        }
        // Retention applies even while no new dead letter arrives to trigger it.
        if let Err(e) = store.trim_dead_letters(now_ms()).await {
            tracing::debug!(error = %e, "dead-letter trimming skipped");
        }
        if let Ok(n) = store.count_dead_letters().await {
            metrics.dead_letters_stored.set(n as i64);
        }
        if let Err(e) = crate::circuit::refresh_gauge(&store, &metrics, &mut circuits_shown).await {
            tracing::debug!(error = %e, "open-circuit gauge not refreshed");
        }
        for kind in JobKind::ALL {
            if let Ok(oldest) = store.oldest_waiting(kind.as_str()).await {
                let age = oldest.map(|at| (now_ms() - at).max(0) as f64 / 1000.0).unwrap_or(0.0);
                metrics.oldest_job_age.with_label_values(&[kind.as_str()]).set(age);
            }
        }
    }
}

async fn refresh_queues(
    connection: &lapin::Connection,
    topology: &Topology,
    metrics: &Metrics,
) -> Result<(), lapin::Error> {
    // A passive declare of a missing queue closes its channel: one channel per pass, reopened on error.
    let mut channel = connection.create_channel().await?;
    for q in topology.queues() {
        let options = QueueDeclareOptions { passive: true, ..Default::default() };
        match channel.queue_declare(q.name.as_str().into(), options, FieldTable::default()).await {
            Ok(info) => {
                metrics.queue_messages.with_label_values(&[&q.name]).set(info.message_count() as i64);
                metrics.queue_consumers.with_label_values(&[&q.name]).set(info.consumer_count() as i64);
            }
            Err(_) => channel = connection.create_channel().await?,
        }
    }
    let _ = channel.close(200, "stats".into()).await;
    Ok(())
}
