//! The dispatcher: the fleet's HTTP API. It turns tool calls into durable AMQP jobs (202 only after
//! the broker's publisher confirm), keeps the tool registry, and serves executions and dead letters.

pub mod circuit;
pub mod config;
mod console;
pub mod error;
pub mod knowledge_base;
pub mod lanes;
pub mod mcp_discovery;
mod routes;
pub mod scopes;
mod signing;
mod state;
pub mod stats;
pub mod stream;
mod tenancy;
pub mod tool_schemas;
pub mod validate;
mod wire;

use std::sync::Arc;

use fleet_platform::service::Process;
use fleet_platform::shutdown::Lifetime;

pub use config::DispatcherConfig;
pub use console::{routes as console_routes, ConsoleAccess, ConsoleRoute};
pub use routes::{openapi, openapi_text};
pub use state::{AppState, Shared};

#[derive(Debug, thiserror::Error)]
pub enum DispatcherError {
    #[error(transparent)]
    Open(#[from] fleet_platform::service::OpenError),
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
}

impl fleet_platform::service::ServiceConfig for DispatcherConfig {
    fn load(src: &fleet_platform::config::Source) -> Result<Self, fleet_platform::config::ConfigError> {
        DispatcherConfig::load(src)
    }
    fn common(&self) -> &fleet_platform::config::CommonConfig {
        &self.common
    }
    fn http_addr(&self) -> std::net::SocketAddr {
        self.http_addr
    }
}

/// Runs the dispatcher until its intake is cancelled: the HTTP server stops taking requests and
/// finishes those in flight; then the broker supervisor and the background tasks, which those
/// requests may still need, stop. Everything spawned here is awaited here.
pub async fn run(config: DispatcherConfig, lifetime: Lifetime) -> Result<(), DispatcherError> {
    let Process { metrics, store, listener, broker: link, lifetime, mut background } =
        Process::open("dispatcher", &config, &lifetime).await?;
    let topology = config.common.topology.clone();
    let stats =
        stats::poll(link.clone(), topology, store.clone(), metrics.clone(), config.stats_interval, background.token());
    background.spawn(stats);
    let topology = config.common.topology.clone();
    let drain =
        fleet_platform::dead_letters::drain(link.clone(), topology, store.clone(), metrics.clone(), background.token());
    background.spawn(drain);
    // Open streams end as soon as shutdown begins, so they do not hold the server's drain.
    let streams = stream::StreamHub::start(store.clone(), lifetime.intake().child_token());
    let lanes = lanes::LightLanes::new(
        config.light_lane_turns,
        config.light_lane_tool_calls,
        config.flooding_tenant_submissions,
    );
    let mcp = Arc::new(fleet_platform::mcp::McpClients::new());
    let refresh = mcp_discovery::every(
        store.clone(),
        config.secrets_key.clone(),
        Arc::clone(&mcp),
        config.mcp_discovery_interval,
        background.token(),
    );
    background.spawn(refresh);
    let state = AppState(Arc::new(Shared {
        config: Arc::new(config),
        broker: link,
        store,
        metrics,
        tool_schemas: Default::default(),
        streams: streams.clone(),
        console_tasks: tokio_util::task::TaskTracker::new(),
        shutdown: lifetime.intake().child_token(),
        lanes: Arc::new(lanes),
        mcp,
        services_index: Default::default(),
    }));
    let console_tasks = state.console_tasks.clone();
    tracing::info!(addr = %state.config.http_addr, "dispatcher listening");
    let served =
        fleet_platform::ops::serve(listener, routes::router(state.clone(), console::router(state)), lifetime.intake())
            .await;
    streams.stopped().await;
    console_tasks.close();
    console_tasks.wait().await;
    background.stop().await;
    served.map_err(DispatcherError::Serve)
}
