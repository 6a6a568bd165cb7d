//! The worker: consumes jobs with manual acks and a concurrency limit, claims each in Redis before
//! any side effect, sends signed callbacks, and retries through broker-held delay queues. This file
//! is the module list and the process's wiring (`run`); the consume loop is `intake`.

mod activity;
mod arguments;
pub mod callback;
pub mod config;
mod context;
mod delivery;
mod eviction;
pub mod health;
pub mod http;
mod intake;
mod jobs;
pub mod llm;
mod memory;
mod notify;
mod outcome;
mod provider_budgets;
mod publish;
pub mod registry;
mod retry_policy;
mod settle;
pub mod signature;

use std::sync::Arc;

use fleet_platform::metrics::Metrics;
use fleet_platform::service;
use fleet_platform::shutdown::Lifetime;

pub use config::WorkerConfig;
use context::WorkerParts;

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

/// Runs a worker until its intake is cancelled, then stops taking jobs, finishes what it holds
/// within the grace period, and returns the rest to the queue (by closing its channels unacked);
/// only then do the broker supervisor and the HTTP surface, which those jobs need, stop.
pub async fn run(config: WorkerConfig, lifetime: Lifetime) -> Result<(), WorkerError> {
    let metrics = Metrics::new("worker");
    provider_budgets::report_limits(&metrics, &config.common.llm);
    let store = service::open_store(&config.common, metrics.clone())?;
    let listener = fleet_platform::ops::bind(config.http_addr)
        .await
        .map_err(|source| WorkerError::Bind { addr: config.http_addr, source })?;
    eviction::warn_if_keys_may_be_evicted(&store).await;

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
    let shared = Arc::new(WorkerParts::new(&config, store, metrics));
    let intake = lifetime.intake();
    let pickups = tokio::spawn(intake::write_pickups(shared.clone(), intake.child_token()));
    intake::consume(shared, link, consumers, intake).await;
    let _ = pickups.await;

    background.cancel();
    let _ = activity.await;
    let _ = supervisor.await;
    let _ = ops.await;
    Ok(())
}
