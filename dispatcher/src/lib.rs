//! The dispatcher: the fleet's HTTP API. It turns tool calls into durable AMQP jobs (202 only after
//! the broker's publisher confirm), keeps the tool registry, and serves executions and dead letters.

pub mod circuit;
pub mod config;
pub mod error;
mod routes;
pub mod scopes;
mod signing;
pub mod stats;
pub mod stream;
pub mod tool_schemas;
pub mod validate;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use fleet_platform::broker::{self, BrokerLink};
use fleet_platform::metrics::Metrics;
use fleet_platform::store::Store;

pub use config::DispatcherConfig;
pub use routes::{openapi, openapi_text};

/// Everything a request handler needs.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<DispatcherConfig>,
    pub broker: BrokerLink,
    pub store: Store,
    pub metrics: Metrics,
    /// Registered tools' compiled schemas (2 s), so enqueueing does not read Redis every time.
    pub tool_schemas: Arc<tool_schemas::SchemaCache>,
    /// Session streams: one reader per session, shared by its listeners.
    pub streams: Arc<stream::StreamHub>,
}

#[derive(Debug, thiserror::Error)]
pub enum DispatcherError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
    #[error(transparent)]
    Store(#[from] fleet_platform::store::StoreError),
}

/// Runs the dispatcher until `cancel` fires: the broker supervisor and the HTTP server, both owned
/// and awaited here. In-flight requests finish before this returns.
pub async fn run(config: DispatcherConfig, cancel: CancellationToken) -> Result<(), DispatcherError> {
    let metrics = Metrics::new("dispatcher");
    let store = Store::open(
        &config.common.redis_url,
        config.common.keys.clone(),
        config.common.redis_timeout,
        metrics.clone(),
        &config.common.tls,
    )?
    .with_dead_letter_retention(config.common.dead_letter_retention);
    let listener = fleet_platform::ops::bind(config.http_addr)
        .await
        .map_err(|source| DispatcherError::Bind { addr: config.http_addr, source })?;
    // The broker connection outlives the HTTP server so that requests still in flight at shutdown
    // can finish their publishes.
    let broker_cancel = CancellationToken::new();
    let (link, supervisor) = broker::supervise(
        config.common.amqp_urls.clone(),
        config.common.tls.clone(),
        config.common.topology.clone(),
        config.common.publish_timeout,
        metrics.clone(),
        broker_cancel.clone(),
    );
    let supervisor = tokio::spawn(supervisor);
    let stats = tokio::spawn(stats::poll(
        link.clone(),
        config.common.topology.clone(),
        store.clone(),
        metrics.clone(),
        config.stats_interval,
        broker_cancel.clone(),
    ));
    let drain = tokio::spawn(fleet_platform::dead_letters::drain(
        link.clone(),
        config.common.topology.clone(),
        store.clone(),
        metrics.clone(),
        broker_cancel.clone(),
    ));
    // Open streams end as soon as shutdown begins, so they do not hold the server's drain.
    let streams = stream::StreamHub::start(store.clone(), cancel.child_token());
    let state = AppState {
        config: Arc::new(config),
        broker: link,
        store,
        metrics,
        tool_schemas: Default::default(),
        streams: streams.clone(),
    };
    tracing::info!(addr = %state.config.http_addr, "dispatcher listening");
    let served = fleet_platform::ops::serve(listener, routes::router(state), cancel).await;
    streams.stopped().await;
    broker_cancel.cancel();
    let _ = stats.await;
    let _ = drain.await;
    let _ = supervisor.await;
    served.map_err(DispatcherError::Serve)
}
