//! The registries: tools, webhooks, and seed 000's assistants and rooms.

mod agents;
mod tools;

pub use agents::{AssistantVersion, AssistantWrite, RegistryPage, RoomVersion};
pub use tools::{StoredMcpServer, StoredTool, StoredWebhook, ToolVersion};

use crate::store::client::Redis;

#[derive(Clone)]
pub struct Registry {
    pub(crate) redis: Redis,
}
