//! The registries: tools, webhooks, MCP servers, and seed 000's assistants, rooms and data sources.

mod agents;
mod data_sources;
mod tools;

pub use agents::{AssistantVersion, AssistantWrite, RegistryPage, RoomVersion};
pub use data_sources::{ConnectionStatus, DataSourceVersion, SchemaStatus, SourceUpdate, StoredDataSource};
pub use tools::{StoredMcpServer, StoredTool, StoredWebhook, ToolVersion};

use crate::store::client::Redis;

#[derive(Clone)]
pub struct Registry {
    pub(crate) redis: Redis,
}
