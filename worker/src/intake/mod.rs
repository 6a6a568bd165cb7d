//! The worker's AMQP intake: consumes every work queue across broker reconnections, runs each
//! delivery as a job task under the worker's concurrency bound, and once cancelled stops taking
//! jobs, lets those it holds finish within the grace period and returns the rest to the queue.

mod channel;
mod flight;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use fleet_platform::broker::{BrokerLink, Live};
use fleet_platform::shutdown::Lifetime;

use crate::context::WorkerParts;
use crate::health::Consumers;
use channel::{open_consumers, ConsumerChannel, Deliveries};
use flight::JobTasks;

/// Consumes from every work queue across broker reconnections until `lifetime`'s intake is
/// cancelled, then drains.
///
/// Prefetch is per consumer (quorum queues have no per-channel QoS), so the channel may hold a
/// delivery of every kind at once; the bound is the worker's own (`JobTasks`).
pub(crate) async fn consume(
    parts: Arc<WorkerParts>,
    mut link: BrokerLink,
    consumers: Arc<Consumers>,
    lifetime: &Lifetime,
) {
    let cancel = lifetime.intake();
    let grace = parts.config.shutdown_grace;
    let mut intake =
        Intake { jobs: JobTasks::new(parts.config.concurrency), closers: JoinSet::new(), parts, consumers };
    while let Some(live) = link.wait_live(&cancel).await {
        let (consumer, deliveries) =
            match open_consumers(&live, &intake.parts.config, lifetime, &mut intake.closers).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start consuming; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                        _ = cancel.cancelled() => break,
                    }
                }
            };
        match intake.take_jobs(&mut link, &live, consumer, deliveries, &cancel).await {
            Ended::Cancelled => break,
            Ended::Lost | Ended::Resubscribed => {}
        }
    }
    intake.jobs.drain(grace).await;
    // Every job has settled (or was aborted): the retired channels close now, returning whatever
    // they still hold unacked.
    while intake.closers.join_next().await.is_some() {}
}

/// What the intake holds across its channels.
struct Intake {
    parts: Arc<WorkerParts>,
    consumers: Arc<Consumers>,
    jobs: JobTasks,
    /// Retired channels closing once their jobs settle, and every channel's ack sender.
    closers: JoinSet<()>,
}

/// How taking jobs from one channel ended.
enum Ended {
    Cancelled,
    /// The connection is gone.
    Lost,
    Resubscribed,
}

impl Intake {
    /// Takes jobs from `consumer` (a channel) while a permit is free, until `cancel`, the connection's loss, or a
    /// consumer's end or error (then it resubscribes).
    async fn take_jobs(
        &mut self,
        link: &mut BrokerLink,
        live: &Live,
        consumer: ConsumerChannel,
        mut deliveries: Deliveries,
        cancel: &CancellationToken,
    ) -> Ended {
        self.consumers.set(true);
        let jobs = &mut self.jobs;
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    self.consumers.set(false);
                    consumer.retire(&mut deliveries, &mut self.closers).await;
                    return Ended::Cancelled;
                }
                // The channel is gone with its connection: its jobs' deliveries return to the queue
                // by themselves, and the claim fences off whichever copy runs second.
                _ = link.lost(live) => break,
                Some(_) = self.closers.join_next(), if !self.closers.is_empty() => {}
                _ = jobs.flight.idle.notified() => {
                    jobs.reap();
                    if jobs.idle() {
                        crate::memory::release_freed_memory();
                    }
                }
                acquired = jobs.permits.clone().acquire_owned(), if jobs.permit.is_none() => {
                    jobs.permit = acquired.ok();
                }
                delivery = deliveries.next(), if jobs.permit.is_some() => match next_item(delivery) {
                    ConsumerItem::Run(delivery) => {
                        consumer.acks.delivered(delivery.delivery_tag);
                        let (parts, publisher, acks) = (self.parts.clone(), live.publisher.clone(), consumer.acks.clone());
                        let job = crate::delivery::handle(parts, delivery, publisher, acks);
                        jobs.spawn(job, consumer.hold());
                    }
                    ConsumerItem::Resubscribe(why) => {
                        tracing::warn!(why, "resubscribing; running jobs finish on the retired channel");
                        self.consumers.set(false);
                        consumer.retire(&mut deliveries, &mut self.closers).await;
                        return Ended::Resubscribed;
                    }
                },
            }
        }
        self.consumers.set(false);
        Ended::Lost
    }
}

/// Writes the newest pickup per job kind to Redis once a second (the oldest-job-age gauge reads it
/// beside the work queue's depth), until `cancel`.
pub(crate) async fn write_pickups(parts: Arc<WorkerParts>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.cancelled() => return,
        }
        for (kind, entered_ms) in parts.pickups.take_unwritten() {
            if let Err(e) = parts.store.executions().note_pickup(kind, entered_ms).await {
                tracing::debug!(error = %e, "pickup time not written");
            }
        }
    }
}

/// What one item of the merged consumer stream asks for.
#[derive(Debug, PartialEq)]
enum ConsumerItem<T> {
    Run(T),
    /// A consumer errored or was cancelled by the broker (its queue deleted, a node lost).
    Resubscribe(&'static str),
}

fn next_item<T, E: std::fmt::Display>(item: Option<Option<Result<T, E>>>) -> ConsumerItem<T> {
    match item {
        Some(Some(Ok(delivery))) => ConsumerItem::Run(delivery),
        Some(Some(Err(e))) => {
            tracing::warn!(error = %e, "consumer error");
            ConsumerItem::Resubscribe("consumer error")
        }
        Some(None) | None => ConsumerItem::Resubscribe("a consumer was cancelled by the broker"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_runs_and_a_consumer_end_or_error_resubscribes() {
        assert_eq!(next_item::<u32, String>(Some(Some(Ok(7)))), ConsumerItem::Run(7));
        assert_eq!(
            next_item::<u32, String>(Some(Some(Err("channel closed".into())))),
            ConsumerItem::Resubscribe("consumer error")
        );
        let cancelled = ConsumerItem::Resubscribe("a consumer was cancelled by the broker");
        assert_eq!(next_item::<u32, String>(Some(None)), cancelled);
        assert_eq!(next_item::<u32, String>(None), cancelled);
    }
}
