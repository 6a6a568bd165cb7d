//! The worker: consumes jobs with manual acks and a concurrency limit, claims each in Redis before
//! any side effect, sends signed callbacks, and retries through broker-held delay queues. This file
//! is the module list and the process's wiring (`run`); the consume loop is `intake`.

mod activity;
mod arguments;
pub mod callback;
pub mod config;
mod context;
mod data_source_call;
mod delivery;
mod eviction;
pub mod health;
pub mod http;
mod intake;
mod jobs;
pub mod llm;
mod mcp_call;
mod memory;
mod notify;
mod outcome;
mod overrides;
mod provider_budgets;
mod publish;
pub mod registry;
mod retry_policy;
mod settle;
pub mod signature;

use std::sync::Arc;

use fleet_platform::service::{OpenError, Process};
use fleet_platform::shutdown::Lifetime;

pub use config::WorkerConfig;
use context::WorkerParts;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Open(#[from] OpenError),
}

impl fleet_platform::service::ServiceConfig for WorkerConfig {
    fn load(src: &fleet_platform::config::Source) -> Result<Self, fleet_platform::config::ConfigError> {
        WorkerConfig::load(src)
    }
    fn common(&self) -> &fleet_platform::config::CommonConfig {
        &self.common
    }
    fn http_addr(&self) -> std::net::SocketAddr {
        self.http_addr
    }
}

/// Runs a worker until its intake is cancelled, then stops taking jobs, finishes what it holds
/// within the grace period, and returns the rest to the queue (by closing its channels unacked);
/// only then do the broker supervisor and the HTTP surface, which those jobs need, stop.
pub async fn run(config: WorkerConfig, lifetime: Lifetime) -> Result<(), WorkerError> {
    let Process { metrics, store, listener, broker, lifetime, mut background } =
        Process::open("worker", &config, &lifetime).await?;
    provider_budgets::report_limits(&metrics, &config.common.llm);
    eviction::warn_if_keys_may_be_evicted(&store).await;

    let consumers = health::Consumers::new();
    let readiness = health::readiness(broker.clone(), store.clone(), consumers.clone());
    let liveness =
        health::liveness(broker.clone(), config.common.topology.clone(), consumers.clone(), config.liveness_grace);
    let ops = fleet_platform::ops::router(metrics.clone(), readiness, Some(liveness));
    background.spawn(fleet_platform::ops::serve(listener, ops, background.token()));
    tracing::info!(addr = %config.http_addr, concurrency = config.concurrency, worker_id = %config.worker_id, "worker started");

    // Beside the jobs until they have drained: what finished during the drain is reported too.
    let worker_id = config.worker_id.as_str().into();
    background.spawn(activity::report(store.clone(), metrics.clone(), worker_id, background.token()));
    let parts = Arc::new(WorkerParts::new(&config, store, metrics));
    let intake = lifetime.intake();
    let pickups = tokio::spawn(intake::write_pickups(parts.clone(), intake.child_token()));
    intake::consume(parts, broker, consumers, &lifetime).await;
    let _ = pickups.await;

    background.stop().await;
    Ok(())
}
