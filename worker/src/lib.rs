//! The worker: consumes jobs with manual acks and a concurrency limit, claims each in Redis before
//! any side effect, sends signed callbacks, and retries through broker-held delay queues.

mod activity;
mod arguments;
pub mod callback;
pub mod config;
mod context;
mod delivery;
pub mod health;
pub mod http;
mod jobs;
pub mod llm;
mod notify;
mod outcome;
mod publish;
pub mod registry;
mod retry_policy;
mod settle;
pub mod signature;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::convert::Infallible;

use futures::{FutureExt, StreamExt};
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use fleet_platform::acks::BatchAcks;
use fleet_platform::broker::{self, BrokerLink, Live};
use fleet_platform::metrics::Metrics;
use fleet_platform::service;
use fleet_platform::shutdown::Lifetime;
use fleet_platform::store::Store;
use fleet_protocol::callback::MAX_RESPONSE_BYTES;
use fleet_protocol::envelope::JobKind;

pub use config::WorkerConfig;
use context::Shared;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] fleet_platform::store::StoreError),
}

impl fleet_platform::service::ServiceConfig for WorkerConfig {
    fn load(src: &fleet_platform::config::Source) -> Result<Self, fleet_platform::config::ConfigError> {
        WorkerConfig::load(src)
    }
    fn common(&self) -> &fleet_platform::config::CommonConfig {
        &self.common
    }
}

/// Each provider's configured budget per minute, so its use can be read as a fraction of it.
fn report_budgets(metrics: &Metrics, routing: &fleet_platform::config::LlmRouting) {
    for provider in routing.names() {
        let Some(budget) = routing.budget_of(provider) else { continue };
        let limits = [("requests", budget.requests_per_minute.map(u64::from)), ("tokens", budget.tokens_per_minute)];
        for (unit, per_minute) in limits {
            if let Some(n) = per_minute {
                metrics.llm_budget_limit.with_label_values(&[provider, unit]).set(n.min(i64::MAX as u64) as i64);
            }
        }
    }
}

/// Runs a worker until its intake is cancelled, then stops taking jobs, finishes what it holds
/// within the grace period, and returns the rest to the queue (by closing its channels unacked);
/// only then do the broker supervisor and the HTTP surface, which those jobs need, stop.
pub async fn run(config: WorkerConfig, lifetime: Lifetime) -> Result<(), WorkerError> {
    let metrics = Metrics::new("worker");
    report_budgets(&metrics, &config.common.llm);
    let store = service::open_store(&config.common, metrics.clone())?;
    let listener = fleet_platform::ops::bind(config.http_addr)
        .await
        .map_err(|source| WorkerError::Bind { addr: config.http_addr, source })?;
    warn_if_keys_may_be_evicted(&store).await;

    let background = lifetime.child();
    let (link, supervisor) = service::supervise_broker(&config.common, metrics.clone(), background.clone());
    let supervisor = tokio::spawn(supervisor);
    let consumers = health::Consumers::new();
    let ops = tokio::spawn(fleet_platform::ops::serve(
        listener,
        fleet_platform::ops::router(
            metrics.clone(),
            health::readiness(link.clone(), store.clone(), consumers.clone()),
            Some(health::liveness(
                link.clone(),
                config.common.topology.clone(),
                consumers.clone(),
                config.liveness_grace,
            )),
        ),
        background.clone(),
    ));
    tracing::info!(addr = %config.http_addr, concurrency = config.concurrency, worker_id = %config.worker_id, "worker started");

    // Beside the jobs until they have drained: what finished during the drain is reported too.
    let activity = tokio::spawn(activity::report(
        store.clone(),
        metrics.clone(),
        config.worker_id.as_str().into(),
        background.clone(),
    ));
    let shared = Arc::new(Shared {
        client: fleet_platform_client(&config),
        llm: llm::LlmClients::new(&config),
        targets: registry::TargetCache::new(config.registry_cache_ttl),
        tools: context::TtlCache::new(config.registry_cache_ttl),
        subscribers: context::TtlCache::new(config.registry_cache_ttl),
        pickups: context::Pickups::default(),
        health_writes: context::Throttle::new(Duration::from_secs(1)),
        queue_names: context::QueueNames::new(&config.common.topology),
        config: config.clone(),
        store,
        metrics,
    });
    let intake = lifetime.intake();
    let pickups = tokio::spawn(write_pickups(shared.clone(), intake.child_token()));
    consume(shared, link, consumers, &config, intake).await;
    let _ = pickups.await;

    background.cancel();
    let _ = activity.await;
    let _ = supervisor.await;
    let _ = ops.await;
    Ok(())
}

fn fleet_platform_client(config: &WorkerConfig) -> http::CallbackClient {
    http::CallbackClient::new(
        config.callback_timeout,
        config.allow_private_callbacks,
        MAX_RESPONSE_BYTES,
        &config.common.tls,
    )
}

/// Consumes from every work queue across broker reconnections until `cancel`, then drains.
///
/// Prefetch is per consumer (quorum queues have no per-channel QoS), so the channel may hold a
/// delivery of every kind at once; the bound is the worker's own: one permit of `concurrency` per
/// running job, whatever its kind and whichever subscription delivered it, taken before the job
/// task is spawned and released once its delivery is settled.
async fn consume(
    shared: Arc<Shared>,
    mut link: BrokerLink,
    consumers: Arc<health::Consumers>,
    config: &WorkerConfig,
    cancel: CancellationToken,
) {
    let permits = Arc::new(Semaphore::new(usize::from(config.concurrency)));
    let mut permit: Option<OwnedSemaphorePermit> = None;
    // Finished jobs are collected as new ones start and when the last one in flight ends
    // (`flight`), not awaited one by one: that woke this loop once more for every job.
    let mut tasks: JoinSet<()> = JoinSet::new();
    let flight = Arc::new(Flight::default());
    let mut closers: JoinSet<()> = JoinSet::new();
    'connections: while let Some(live) = link.wait_live(&cancel).await {
        let (lane, mut deliveries) = match open_consumers(&live, config, &mut closers).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot start consuming; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => continue 'connections,
                    _ = cancel.cancelled() => break 'connections,
                }
            }
        };
        consumers.set(true);
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    consumers.set(false);
                    lane.retire(&mut deliveries, &mut closers).await;
                    break 'connections;
                }
                // The channel is gone with its connection: its jobs' deliveries return to the queue
                // by themselves, and the claim fences off whichever copy runs second.
                _ = link.lost(&live) => break,
                Some(_) = closers.join_next(), if !closers.is_empty() => {}
                _ = flight.idle.notified() => {
                    reap(&mut tasks);
                    // The last job's task may still be ending: its count says its work is done.
                    if flight.jobs.load(Ordering::Acquire) == 0 {
                        release_freed_memory();
                    }
                }
                acquired = permits.clone().acquire_owned(), if permit.is_none() => permit = acquired.ok(),
                delivery = deliveries.next(), if permit.is_some() => match next_step(delivery) {
                    Step::Run(delivery) => {
                        lane.acks.delivered(delivery.delivery_tag);
                        let job = delivery::handle(shared.clone(), delivery, live.publisher.clone(), lane.acks.clone());
                        let held = (permit.take(), lane.hold(), flight.enter());
                        tasks.spawn(async move {
                            job.await;
                            drop(held);
                        });
                        reap(&mut tasks);
                    }
                    Step::Resubscribe(why) => {
                        tracing::warn!(why, "resubscribing; running jobs finish on the retired channel");
                        consumers.set(false);
                        lane.retire(&mut deliveries, &mut closers).await;
                        continue 'connections;
                    }
                },
            }
        }
        consumers.set(false);
    }
    drain(&mut tasks, config.shutdown_grace).await;
    // Every job has settled (or was aborted): the retired channels close now, returning whatever
    // they still hold unacked.
    while closers.join_next().await.is_some() {}
}

/// Writes the newest pickup per job kind to Redis once a second (the oldest-job-age gauge reads it
/// beside the work queue's depth), until `cancel`.
async fn write_pickups(shared: Arc<Shared>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.cancelled() => return,
        }
        for (kind, entered_ms) in shared.pickups.take_unwritten() {
            if let Err(e) = shared.store.executions().note_pickup(kind, entered_ms).await {
                tracing::debug!(error = %e, "pickup time not written");
            }
        }
    }
}

/// What one item of the merged consumer stream asks for.
#[derive(Debug, PartialEq)]
enum Step<T> {
    Run(T),
    /// A consumer errored or was cancelled by the broker (its queue deleted, a node lost).
    Resubscribe(&'static str),
}

fn next_step<T, E: std::fmt::Display>(item: Option<Option<Result<T, E>>>) -> Step<T> {
    match item {
        Some(Some(Ok(delivery))) => Step::Run(delivery),
        Some(Some(Err(e))) => {
            tracing::warn!(error = %e, "consumer error");
            Step::Resubscribe("consumer error")
        }
        Some(None) | None => Step::Resubscribe("a consumer was cancelled by the broker"),
    }
}

/// Deliveries from every work queue; `None` marks the end of one queue's consumer (a broker-side
/// cancel), which must not go unnoticed while the other queues' consumers keep the stream alive.
type Deliveries = futures::stream::SelectAll<
    futures::stream::BoxStream<'static, Option<Result<lapin::message::Delivery, lapin::Error>>>,
>;

/// One subscription: a channel, its consumers, its batched acks, and a count of the jobs it
/// delivered that have not settled yet (each job holds a clone of `holds`; the channel may close
/// once all are dropped and their acks are sent). Dropping it stops its ack sender.
struct Lane {
    channel: lapin::Channel,
    tags: Vec<String>,
    acks: Arc<BatchAcks>,
    acks_stop: tokio_util::sync::DropGuard,
    holds: mpsc::Sender<Infallible>,
    settled: mpsc::Receiver<Infallible>,
}

/// How long a settled delivery's ack may wait for the deliveries before it on its channel to
/// settle too (then it is sent alone): short beside a job, so prefetch slots are not held.
const ACK_LINGER: Duration = Duration::from_millis(5);

impl Lane {
    fn hold(&self) -> mpsc::Sender<Infallible> {
        self.holds.clone()
    }

    /// Stops consuming on this channel without closing it under running jobs: deliveries not yet
    /// started go back to the queue now, running ones settle on this channel, and only then does
    /// it close (closing it earlier would requeue deliveries whose jobs keep running).
    async fn retire(self, deliveries: &mut Deliveries, closers: &mut JoinSet<()>) {
        let Lane { channel, tags, acks, acks_stop, holds, mut settled } = self;
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

async fn open_consumers(
    live: &Live,
    config: &WorkerConfig,
    closers: &mut JoinSet<()>,
) -> Result<(Lane, Deliveries), broker::BrokerError> {
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
    let stop = CancellationToken::new();
    // Owned by the closers: it ends when the lane is dropped or retired (its guard cancels it),
    // after one last send.
    closers.spawn(acks.clone().run(stop.clone()));
    let lane = Lane { channel, tags, acks, acks_stop: stop.drop_guard(), holds, settled };
    Ok((lane, futures::stream::select_all(consumers)))
}

/// The worker's jobs in flight, across its lanes.
#[derive(Default)]
struct Flight {
    jobs: AtomicUsize,
    /// Woken when the last job in flight ends.
    idle: Notify,
}

/// One job in flight, until its task drops it: when it ends, panics or is aborted.
struct InFlight(Arc<Flight>);

impl Flight {
    fn enter(self: &Arc<Self>) -> InFlight {
        self.jobs.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.jobs.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_one();
        }
    }
}

/// Collects the job tasks that have finished, without waiting for any; reports a panic.
fn reap(tasks: &mut JoinSet<()>) {
    while let Some(done) = tasks.try_join_next() {
        if let Err(e) = done {
            if e.is_panic() {
                tracing::error!("a job task panicked; its delivery returns to the queue");
            }
        }
    }
}

/// Lets held jobs finish within `grace`; the rest are aborted and their deliveries, never acked,
/// return to the queue when the channel closes.
async fn drain(tasks: &mut JoinSet<()>, grace: Duration) {
    if tasks.is_empty() {
        return;
    }
    tracing::info!(held = tasks.len(), grace_s = grace.as_secs_f64(), "finishing held jobs");
    let finished = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    if finished.is_err() {
        tracing::warn!(unfinished = tasks.len(), "grace period over; returning unfinished jobs to the queue");
        tasks.shutdown().await;
    }
}

/// Idempotency keys must never be evicted: an evicted claim lets a job run twice.
async fn warn_if_keys_may_be_evicted(store: &Store) {
    match store.redis().maxmemory_policy().await {
        Ok(policy) if policy != "noeviction" && !policy.is_empty() && !policy.starts_with("volatile-") => {
            tracing::warn!(
                maxmemory_policy = %policy,
                "Redis may evict idempotency keys under memory pressure (a job could then run twice); set maxmemory-policy noeviction"
            );
        }
        Ok(policy) if policy.starts_with("volatile-") => {
            tracing::warn!(
                maxmemory_policy = %policy,
                "Redis evicts keys that have a TTL, and idempotency keys do; set maxmemory-policy noeviction"
            );
        }
        _ => {}
    }
}

/// Hands memory freed after a burst back to the system when the worker falls idle: glibc's
/// allocator otherwise keeps it in its arenas, and the worker's RSS would stay at its peak.
/// At most once a second: a trim walks the heap, and at low load the worker idles between jobs.
fn release_freed_memory() {
    use std::sync::atomic::{AtomicI64, Ordering};
    static LAST_TRIM_MS: AtomicI64 = AtomicI64::new(0);
    let now = fleet_platform::now_ms();
    if now - LAST_TRIM_MS.load(Ordering::Relaxed) < 1000 {
        return;
    }
    LAST_TRIM_MS.store(now, Ordering::Relaxed);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns unused heap pages to the kernel; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_runs_and_a_consumer_end_or_error_resubscribes() {
        assert_eq!(next_step::<u32, String>(Some(Some(Ok(7)))), Step::Run(7));
        assert_eq!(
            next_step::<u32, String>(Some(Some(Err("channel closed".into())))),
            Step::Resubscribe("consumer error")
        );
        let cancelled = Step::Resubscribe("a consumer was cancelled by the broker");
        assert_eq!(next_step::<u32, String>(Some(None)), cancelled);
        assert_eq!(next_step::<u32, String>(None), cancelled);
    }

    #[tokio::test]
    async fn the_last_job_in_flight_wakes_the_loop_even_when_its_task_panics() {
        let flight = Arc::new(Flight::default());
        let (first, last) = (flight.enter(), flight.enter());
        drop(first);
        assert_eq!(flight.jobs.load(Ordering::Acquire), 1);
        let task = tokio::spawn(async move {
            let _held = last;
            panic!("a job panics");
        });
        assert!(task.await.unwrap_err().is_panic());
        assert_eq!(flight.jobs.load(Ordering::Acquire), 0);
        tokio::time::timeout(Duration::from_secs(5), flight.idle.notified()).await.expect("the loop is woken");
    }
}
