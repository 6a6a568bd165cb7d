//! The worker's subscription to every work queue: a channel consuming them all, with its batched
//! acks, opened on each (re)connection and retired without closing it under the jobs it delivered.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use fleet_platform::acks::BatchAcks;
use fleet_platform::broker::{self, Live};
use fleet_platform::shutdown::Lifetime;
use fleet_protocol::envelope::JobKind;
use futures::{FutureExt, StreamExt};
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::config::WorkerConfig;

/// Deliveries from every work queue; `None` marks the end of one queue's consumer (a broker-side
/// cancel), which must not go unnoticed while the other queues' consumers keep the stream alive.
/// Each consumer's stream is boxed to be named: `select_all` needs one stream type, and a
/// consumer chained with its end marker has a type that cannot be written down.
pub(super) type Deliveries = futures::stream::SelectAll<
    futures::stream::BoxStream<'static, Option<Result<lapin::message::Delivery, lapin::Error>>>,
>;

/// One subscription: a channel, its consumers, its batched acks, and a count of the jobs it
/// delivered that have not settled yet (each job holds a clone of `holds`; the channel may close
/// once all are dropped and their acks are sent). Dropping it stops its ack sender.
pub(super) struct ConsumerChannel {
    channel: lapin::Channel,
    tags: Vec<String>,
    pub(super) acks: Arc<BatchAcks>,
    acks_stop: tokio_util::sync::DropGuard,
    holds: mpsc::Sender<Infallible>,
    settled: mpsc::Receiver<Infallible>,
}

/// How long a settled delivery's ack may wait for the deliveries before it on its channel to
/// settle too (then it is sent alone): short beside a job, so prefetch slots are not held.
const ACK_LINGER: Duration = Duration::from_millis(5);

impl ConsumerChannel {
    /// What a job it delivered holds until it settles: the channel stays open while any is held.
    pub(super) fn hold(&self) -> mpsc::Sender<Infallible> {
        self.holds.clone()
    }

    /// Stops consuming on this channel without closing it under running jobs: deliveries not yet
    /// started go back to the queue now, running ones settle on this channel, and only then does
    /// it close (closing it earlier would requeue deliveries whose jobs keep running).
    pub(super) async fn retire(self, deliveries: &mut Deliveries, closers: &mut JoinSet<()>) {
        let ConsumerChannel { channel, tags, acks, acks_stop, holds, mut settled } = self;
        for tag in &tags {
            let _ = channel.basic_cancel(tag.as_str().into(), BasicCancelOptions::default()).await;
        }
        while let Some(Some(item)) = deliveries.next().now_or_never() {
            if let Some(Ok(delivery)) = item {
                acks.delivered(delivery.delivery_tag);
                let _ = acks.requeue(delivery.delivery_tag).await;
            }
        }
        drop(holds);
        closers.spawn(async move {
            while settled.recv().await.is_some() {}
            // Every job settled: their acks go out before the channel closes (closing first would
            // return settled deliveries to the queue).
            let _ = acks.send(Duration::ZERO).await;
            drop(acks_stop);
            let _ = channel.close(200, "retired".into()).await;
        });
    }
}

/// Opens a channel on `live`'s connection and consumes every queue a job waits in; its ack sender
/// runs among the `closers`, on a token of the process's shutdown tree.
pub(super) async fn open_consumers(
    live: &Live,
    config: &WorkerConfig,
    lifetime: &Lifetime,
    closers: &mut JoinSet<()>,
) -> Result<(ConsumerChannel, Deliveries), broker::BrokerError> {
    let channel = live.connection.create_channel().await?;
    // Redeclared on every subscribe: a queue deleted under the worker comes back.
    broker::declare_topology(&channel, &config.common.topology).await?;
    // Per consumer: any one kind may use every permit.
    channel.basic_qos(config.concurrency, BasicQosOptions::default()).await?;
    let mut consumers = Vec::new();
    let mut tags = Vec::new();
    // Every queue a job waits in, consumed side by side, so a light tenant's new turn is taken
    // while another tenant's backlog waits in the turns' work queue.
    let queues = JobKind::ALL.into_iter().flat_map(|kind| config.common.topology.waiting_queues(kind));
    for queue in queues {
        let tag = format!("{}-{queue}", config.worker_id);
        let consumer = channel
            .basic_consume(
                queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        consumers.push(consumer.map(Some).chain(futures::stream::once(async { None })).boxed());
        tags.push(tag);
    }
    let (holds, settled) = mpsc::channel(1);
    let acks = BatchAcks::new(channel.clone(), ACK_LINGER);
    // A child of the root, like every token of the process: the ack sender outlives the intake
    // while the channel's jobs settle. Owned by the closers: it ends when the consumer channel is
    // dropped or retired (its guard cancels it), after one last send.
    let stop = lifetime.child();
    closers.spawn(acks.clone().run(stop.clone()));
    let consumer = ConsumerChannel { channel, tags, acks, acks_stop: stop.drop_guard(), holds, settled };
    Ok((consumer, futures::stream::select_all(consumers)))
}
