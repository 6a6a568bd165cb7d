//! What every request handler borrows: the dispatcher's shared parts behind one `Arc`. A bottom
//! module: it names the platform's handles and the dispatcher's caches, and no route.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use fleet_platform::broker::BrokerLink;
use fleet_platform::metrics::Metrics;
use fleet_platform::store::Store;

use crate::config::DispatcherConfig;
use crate::{knowledge_base, lanes, stream, tool_schemas};

/// Everything a request handler needs, behind one `Arc`: axum clones the state for every
/// extractor and middleware of every request, and a clone of the parts themselves cost a dozen
/// atomic counts (and a cancellation token's lock) each way, which showed in the dispatcher's profile.
#[derive(Clone)]
pub struct AppState(pub(crate) Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What `AppState` shares.
pub struct Shared {
    pub config: Arc<DispatcherConfig>,
    pub broker: BrokerLink,
    pub store: Store,
    pub metrics: Metrics,
    /// Registered tools' compiled schemas (2 s), so enqueueing does not read Redis every time.
    pub tool_schemas: Arc<tool_schemas::SchemaCache>,
    /// Session streams: one reader per session, shared by its listeners.
    pub streams: Arc<stream::StreamHub>,
    /// The console's background operations (a bulk redrive), awaited at shutdown.
    pub console_tasks: tokio_util::task::TaskTracker,
    /// Fires when shutdown begins: a background operation stops early.
    pub shutdown: CancellationToken,
    /// Which new jobs skip their kind's work queue (tenants not flooding the fleet), and how many
    /// of a flooding tenant's submissions are taken in at once.
    pub lanes: Arc<lanes::LightLanes>,
    /// MCP sessions for discovery, one per server, reused.
    pub mcp: Arc<fleet_platform::mcp::McpClients>,
    /// The services index of the knowledge base's last search, kept while the services are the same.
    pub services_index: Arc<knowledge_base::index::IndexCache>,
}
