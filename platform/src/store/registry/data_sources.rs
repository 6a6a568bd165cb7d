//! Seed 000's data sources as stored: the connection only as ciphertext (bound to the source's id),
//! the schema the last extraction found, and the operator's semantic mappings. Every write is
//! conditional on the entry the writer read, so an extraction finishing and a mapping patch never
//! overwrite each other.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use fleet_protocol::data_sources::{QueryLimits, SealedConnection, SemanticMapping, Table};

use super::tools::EntryKind;
use super::Registry;
use crate::store::script::Lua;
use crate::store::StoreError;

/// Writes an entry only if it is still what the writer read (`ARGV[1]`, empty: absent). KEYS:
/// entry, index (one `{data-sources}` slot).
const DATA_SOURCE_WRITE_LUA: &str = include_str!("lua/data_source_write.lua");
static DATA_SOURCE_WRITE: Lua = Lua::new(|| crate::store::script::load(&[DATA_SOURCE_WRITE_LUA]));

/// Whether the fleet can reach the source, as its last check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionStatus {
    /// Registered or changed; its first check has not finished.
    Checking,
    Connected,
    Error,
}

/// Where its schema stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SchemaStatus {
    Extracting,
    Ready,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredDataSource {
    /// `ds_` and 32 hex digits.
    pub id: String,
    /// Unique in the fleet: its tool is `ds.{name}`.
    pub name: String,
    pub description: String,
    /// Its type and connection, the password and header values encrypted with the secrets key
    /// (bound to `data-source:{id}`).
    pub connection: SealedConnection,
    pub limits: QueryLimits,
    pub status: ConnectionStatus,
    pub schema_status: SchemaStatus,
    /// Why the last check or extraction failed (a safe message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default)]
    pub tables: Vec<Table>,
    #[serde(default)]
    pub mappings: BTreeMap<String, SemanticMapping>,
    /// Its registrant's tenant (none: an operator's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Counts the changes of its connection: an extraction reports against the one it read.
    #[serde(default)]
    pub connection_version: u64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

/// The most characters of schema and mappings a model is told in a source's tool description.
const MAX_TOOL_DESCRIPTION_CHARS: usize = 16_000;

impl StoredDataSource {
    /// The owner its connection's ciphertext is bound to.
    pub fn connection_owner(id: &str) -> String {
        format!("data-source:{id}")
    }

    /// What its tool tells the model: its tables, columns and mappings, bounded.
    pub fn tool_description(&self) -> String {
        let description = Some(self.description.as_str()).filter(|d| !d.is_empty());
        fleet_protocol::data_sources::tool_description(
            &self.name,
            description,
            &self.tables,
            &self.mappings,
            MAX_TOOL_DESCRIPTION_CHARS,
        )
    }
}

/// A data source as read, with the stored text that a conditional write compares against.
#[derive(Debug, Clone)]
pub struct DataSourceVersion {
    pub source: StoredDataSource,
    raw: String,
}

/// What `Registry::update_data_source` did.
#[derive(Debug)]
pub enum SourceUpdate {
    /// Written, as it now is.
    Written(Box<StoredDataSource>),
    Missing,
    /// Its change declined.
    Declined,
    /// Another writer won each of the five reads.
    KeptChanging,
}

impl Registry {
    /// Writes `source` if its entry is unchanged since `previous` was read (`None`: only if there
    /// is none); returns whether it was written.
    pub async fn write_data_source(
        &self,
        source: &StoredDataSource,
        previous: Option<&DataSourceVersion>,
    ) -> Result<bool, StoreError> {
        let json = serde_json::to_string(source).expect("a data source serialises");
        let r: Result<i64, _> = DATA_SOURCE_WRITE
            .key(self.redis.keys.data_source(&source.id))
            .key(self.redis.keys.data_sources_index())
            .arg(previous.map_or("", |p| p.raw.as_str()))
            .arg(json)
            .arg(&source.id)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)? == 1)
    }

    /// Reads source `id`, lets `change` edit it (or decline, answering `false`), tells its tool,
    /// and writes it if nothing wrote it since the read, reading again up to five times. The tool
    /// is told first, so a source that says `ready` has a tool that tells its schema.
    pub async fn update_data_source<E: From<StoreError>>(
        &self,
        id: &str,
        mut change: impl FnMut(&mut StoredDataSource) -> Result<bool, E>,
    ) -> Result<SourceUpdate, E> {
        for _ in 0..5 {
            let Some(found) = self.read_data_source(id).await? else { return Ok(SourceUpdate::Missing) };
            let mut source = found.source.clone();
            if !change(&mut source)? {
                return Ok(SourceUpdate::Declined);
            }
            source.updated_at_ms = crate::now_ms();
            self.describe_data_source_tool(&source).await?;
            if self.write_data_source(&source, Some(&found)).await? {
                return Ok(SourceUpdate::Written(Box::new(source)));
            }
        }
        Ok(SourceUpdate::KeptChanging)
    }

    pub async fn read_data_source(&self, id: &str) -> Result<Option<DataSourceVersion>, StoreError> {
        let read = self.redis.read_json(self.redis.keys.data_source(id), &format!("data source {id}")).await?;
        Ok(read.map(|(source, raw)| DataSourceVersion { source, raw }))
    }

    /// Data sources in id order after `after`, at most `limit`.
    pub async fn list_data_sources(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<StoredDataSource>, StoreError> {
        self.registry_list(EntryKind::DataSources, after, limit).await
    }

    pub async fn delete_data_source(&self, id: &str) -> Result<bool, StoreError> {
        self.registry_delete(EntryKind::DataSources, id).await
    }

    /// Tells `source`'s tool (if it is registered) the source's schema and mappings, written only
    /// over the tool it read; its name, to forget in a cache.
    pub async fn describe_data_source_tool(&self, source: &StoredDataSource) -> Result<String, StoreError> {
        let name = fleet_protocol::data_sources::tool_name(&source.name);
        if let Some(current) = self.read_tool(&name).await? {
            let mut tool = current.tool.clone();
            tool.description = source.tool_description();
            tool.updated_at_ms = crate::now_ms();
            self.write_tool(&tool, Some(&current)).await?;
        }
        Ok(name)
    }
}
