//! The registries: tools (an entry per name, a name index and an id index, written conditionally
//! so concurrent writers neither lose fields nor make two tools of one name) and webhooks (an
//! entry per id plus a lexically sorted index).

use crate::store::script::Lua;

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use fleet_protocol::keys::Keys;
use fleet_protocol::limits::ToolLimits;

use super::Registry;
use crate::store::StoreError;

/// A registered tool as stored: the secret only as ciphertext.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredTool {
    /// The id the API hands out (`tool_…`); empty for a tool stored before tools had ids, until
    /// the dispatcher gives it one.
    #[serde(default)]
    pub id: String,
    pub name: String,
    pub description: String,
    pub parameters: Value,
    pub callback_url: String,
    pub secret_ciphertext: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Signature scheme and, during a secret rotation, the previous secret (ciphertext).
    #[serde(default, skip_serializing_if = "fleet_protocol::signature_scheme::Signing::is_default")]
    pub signing: fleet_protocol::signature_scheme::Signing,
    /// The tool's own retry schedule; none: the fleet's default (`FLEET_RETRY_DELAYS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<fleet_protocol::retry_spec::RetrySpec>,
    /// `max_concurrency` and `rate_limit` (`store/limits.rs` enforces them).
    #[serde(default, skip_serializing_if = "ToolLimits::is_none")]
    pub limits: ToolLimits,
    /// Its own circuit-breaker policy, if it has one (`store/health.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<fleet_protocol::circuit::CircuitBreaker>,
    /// Who runs its calls: the fleet (a callback, the default) or the session's client.
    #[serde(default, skip_serializing_if = "fleet_protocol::tools::ToolExecution::is_callback")]
    pub execution: fleet_protocol::tools::ToolExecution,
    /// A JSON Schema its results must satisfy (seed 001: a client's `tool_output` is checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// Its `effects` and whether (and how long) its calls wait for an operator's decision.
    #[serde(default, skip_serializing_if = "fleet_protocol::approvals::ApprovalSettings::is_default")]
    pub approvals: fleet_protocol::approvals::ApprovalSettings,
}

/// A registered MCP server as stored: its headers only as ciphertext (bound to `mcp:{name}`).
/// Its tools are stored as tools (`ToolExecution::Mcp`), named in `tools`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredMcpServer {
    pub name: String,
    pub url: String,
    /// The encrypted JSON object of the headers each request carries; empty: none.
    #[serde(default)]
    pub headers_ciphertext: String,
    /// Their names, which the API shows.
    #[serde(default)]
    pub header_names: Vec<String>,
    /// The operator's names for its tools: MCP tool name → fleet tool name.
    #[serde(default)]
    pub tool_names: std::collections::BTreeMap<String, String>,
    pub max_discovery_pages: u32,
    pub max_capabilities: u32,
    /// Applied to each of its tools as a tool's own.
    #[serde(default, skip_serializing_if = "ToolLimits::is_none")]
    pub limits: ToolLimits,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<fleet_protocol::retry_spec::RetrySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<fleet_protocol::circuit::CircuitBreaker>,
    /// The operator's policy: a call whose outcome is unknown may be sent again.
    #[serde(default)]
    pub retry_unknown: bool,
    #[serde(default)]
    pub requires_approval_for_destructive: bool,
    /// The fleet names of the tools its last discovery stored.
    #[serde(default)]
    pub tools: Vec<String>,
    #[serde(default)]
    pub discovered_at_ms: i64,
    /// Why the last scheduled discovery failed (sanitised); its tools stay as they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

impl StoredMcpServer {
    /// The owner its headers' ciphertext is bound to.
    pub fn headers_owner(name: &str) -> String {
        format!("mcp:{name}")
    }

    /// Where to reach it, its headers decrypted (in memory only).
    pub fn target(&self, key: &fleet_protocol::secrets::SecretsKey) -> Result<crate::mcp::McpServerTarget, String> {
        let headers = if self.headers_ciphertext.is_empty() {
            vec![]
        } else {
            let text =
                key.decrypt(&Self::headers_owner(&self.name), &self.headers_ciphertext).map_err(|e| e.to_string())?;
            let map: std::collections::BTreeMap<String, String> =
                serde_json::from_str(&text).map_err(|e| e.to_string())?;
            map.into_iter().collect()
        };
        Ok(crate::mcp::McpServerTarget { name: self.name.clone(), url: self.url.clone(), headers })
    }
}

/// A tool as read, with the stored text that a conditional write compares against.
#[derive(Debug, Clone)]
pub struct ToolVersion {
    pub tool: StoredTool,
    raw: String,
}

/// A registered webhook as stored: the secret only as ciphertext.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredWebhook {
    pub id: String,
    pub url: String,
    pub events: Vec<String>,
    pub secret_ciphertext: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Signature scheme and, during a secret rotation, the previous secret (ciphertext).
    #[serde(default, skip_serializing_if = "fleet_protocol::signature_scheme::Signing::is_default")]
    pub signing: fleet_protocol::signature_scheme::Signing,
    /// The webhook's own retry schedule; none: the fleet's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<fleet_protocol::retry_spec::RetrySpec>,
}

/// Writes a tool only if its entry is still what the writer read (`ARGV[1]`, empty: absent), and
/// keeps the id index in step. KEYS: entry, name index, id index (one `{tools}` slot).
const TOOL_WRITE_LUA: &str = include_str!("lua/tool_write.lua");

/// Deletes a tool (only the one with id `ARGV[2]`, unless empty) with its index entries.
const TOOL_DELETE_LUA: &str = include_str!("lua/tool_delete.lua");

/// Which registry an entry belongs to.
#[derive(Debug, Clone, Copy)]
pub(super) enum EntryKind {
    Webhooks,
    McpServers,
    DataSources,
}

impl EntryKind {
    fn entry(self, keys: &Keys, id: &str) -> String {
        match self {
            EntryKind::Webhooks => keys.webhook(id),
            EntryKind::McpServers => keys.mcp_server(id),
            EntryKind::DataSources => keys.data_source(id),
        }
    }
    fn index(self, keys: &Keys) -> String {
        match self {
            EntryKind::Webhooks => keys.webhooks_index(),
            EntryKind::McpServers => keys.mcp_servers_index(),
            EntryKind::DataSources => keys.data_sources_index(),
        }
    }
    fn label(self) -> &'static str {
        match self {
            EntryKind::Webhooks => "webhook",
            EntryKind::McpServers => "MCP server",
            EntryKind::DataSources => "data source",
        }
    }
}

static TOOL_WRITE: Lua = Lua::new(|| crate::store::script::load(&[TOOL_WRITE_LUA]));
static TOOL_DELETE: Lua = Lua::new(|| crate::store::script::load(&[TOOL_DELETE_LUA]));

impl Registry {
    /// Creates or replaces an entry; returns whether it is new.
    async fn registry_put<T: Serialize>(&self, reg: EntryKind, id: &str, value: &T) -> Result<bool, StoreError> {
        let key = reg.entry(&self.redis.keys, id);
        let json = serde_json::to_string(value).expect("a registry entry serialises");
        let r: Result<(Option<String>,), _> = redis::pipe()
            .atomic()
            .cmd("GET")
            .arg(&key)
            .cmd("SET")
            .arg(&key)
            .arg(json)
            .ignore()
            .cmd("ZADD")
            .arg(reg.index(&self.redis.keys))
            .arg(0)
            .arg(id)
            .ignore()
            .query_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)?.0.is_none())
    }

    async fn registry_get<T: serde::de::DeserializeOwned>(
        &self,
        reg: EntryKind,
        id: &str,
    ) -> Result<Option<T>, StoreError> {
        let read = self.redis.read_json(reg.entry(&self.redis.keys, id), &format!("{} {id}", reg.label())).await?;
        Ok(read.map(|(value, _)| value))
    }

    /// Entries in id order after `after`, at most `limit`.
    pub(super) async fn registry_list<T: serde::de::DeserializeOwned>(
        &self,
        reg: EntryKind,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<T>, StoreError> {
        let min = after.map(|a| format!("({a}")).unwrap_or_else(|| "-".into());
        let ids: Result<Vec<String>, _> = redis::cmd("ZRANGEBYLEX")
            .arg(reg.index(&self.redis.keys))
            .arg(min)
            .arg("+")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut self.redis.conn().await?)
            .await;
        let mut entries = Vec::new();
        for id in self.redis.count(ids)? {
            if let Some(entry) = self.registry_get(reg, &id).await? {
                entries.push(entry);
            }
        }
        Ok(entries)
    }

    pub(super) async fn registry_delete(&self, reg: EntryKind, id: &str) -> Result<bool, StoreError> {
        let r: Result<(i64, i64), _> = redis::pipe()
            .atomic()
            .del(reg.entry(&self.redis.keys, id))
            .zrem(reg.index(&self.redis.keys), id)
            .query_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)?.0 > 0)
    }

    /// Writes `tool` if its entry is unchanged since `previous` was read (`None`: only if there is
    /// none); returns whether it was written.
    pub async fn write_tool(&self, tool: &StoredTool, previous: Option<&ToolVersion>) -> Result<bool, StoreError> {
        let json = serde_json::to_string(tool).expect("a tool serialises");
        let r: Result<i64, _> = TOOL_WRITE
            .key(self.redis.keys.tool(&tool.name))
            .key(self.redis.keys.tools_index())
            .key(self.redis.keys.tool_ids())
            .arg(previous.map_or("", |p| p.raw.as_str()))
            .arg(json)
            .arg(&tool.name)
            .arg(&tool.id)
            .arg(previous.map_or("", |p| p.tool.id.as_str()))
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)? == 1)
    }

    pub async fn get_tool(&self, name: &str) -> Result<Option<StoredTool>, StoreError> {
        Ok(self.read_tool(name).await?.map(|v| v.tool))
    }

    /// The tools `names` name, in order (`None`: not registered), in one round trip.
    pub async fn get_tools(&self, names: &[&str]) -> Result<Vec<Option<StoredTool>>, StoreError> {
        if names.is_empty() {
            return Ok(vec![]);
        }
        let mut pipe = redis::pipe();
        for name in names {
            pipe.get(self.redis.keys.tool(name));
        }
        let r: Result<Vec<Option<String>>, _> = pipe.query_async(&mut self.redis.conn().await?).await;
        let read = self.redis.count(r)?;
        names
            .iter()
            .zip(read)
            .map(|(name, raw)| match raw {
                Some(raw) => {
                    serde_json::from_str(&raw).map(Some).map_err(|e| StoreError::Corrupt(format!("tool {name}: {e}")))
                }
                None => Ok(None),
            })
            .collect()
    }

    /// A tool with what a conditional write needs.
    pub async fn read_tool(&self, name: &str) -> Result<Option<ToolVersion>, StoreError> {
        let read = self.redis.read_json(self.redis.keys.tool(name), &format!("tool {name}")).await?;
        Ok(read.map(|(tool, raw)| ToolVersion { tool, raw }))
    }

    /// The name the id index holds for `id` (the caller checks that tool's id: the name may have
    /// been registered again since).
    pub async fn tool_name_by_id(&self, id: &str) -> Result<Option<String>, StoreError> {
        let r: Result<Option<String>, _> = self.redis.conn().await?.hget(self.redis.keys.tool_ids(), id).await;
        self.redis.count(r)
    }

    /// Which of `names` are registered tools, in order.
    pub async fn tools_registered(&self, names: &[String]) -> Result<Vec<bool>, StoreError> {
        if names.is_empty() {
            return Ok(vec![]);
        }
        let mut pipe = redis::pipe();
        for name in names {
            pipe.exists(self.redis.keys.tool(name));
        }
        let r: Result<Vec<bool>, _> = pipe.query_async(&mut self.redis.conn().await?).await;
        self.redis.count(r)
    }

    /// Tools in name order after `after`, at most `limit`.
    pub async fn list_tools(&self, after: Option<&str>, limit: usize) -> Result<Vec<ToolVersion>, StoreError> {
        let min = after.map(|a| format!("({a}")).unwrap_or_else(|| "-".into());
        let names: Result<Vec<String>, _> = redis::cmd("ZRANGEBYLEX")
            .arg(self.redis.keys.tools_index())
            .arg(min)
            .arg("+")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut self.redis.conn().await?)
            .await;
        let mut tools = Vec::new();
        for name in self.redis.count(names)? {
            if let Some(tool) = self.read_tool(&name).await? {
                tools.push(tool);
            }
        }
        Ok(tools)
    }

    /// Deletes the tool named `name` (only if its id is `id`, when given); returns whether it did.
    pub async fn delete_tool(&self, name: &str, id: Option<&str>) -> Result<bool, StoreError> {
        let r: Result<i64, _> = TOOL_DELETE
            .key(self.redis.keys.tool(name))
            .key(self.redis.keys.tools_index())
            .key(self.redis.keys.tool_ids())
            .arg(name)
            .arg(id.unwrap_or(""))
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)? == 1)
    }

    /// Creates or replaces a webhook; returns whether it is new.
    pub async fn put_webhook(&self, hook: &StoredWebhook) -> Result<bool, StoreError> {
        self.registry_put(EntryKind::Webhooks, &hook.id, hook).await
    }

    pub async fn get_webhook(&self, id: &str) -> Result<Option<StoredWebhook>, StoreError> {
        self.registry_get(EntryKind::Webhooks, id).await
    }

    /// Webhooks in id order after `after`, at most `limit`.
    pub async fn list_webhooks(&self, after: Option<&str>, limit: usize) -> Result<Vec<StoredWebhook>, StoreError> {
        self.registry_list(EntryKind::Webhooks, after, limit).await
    }

    /// Every webhook subscribed to `event`.
    pub async fn subscribers(&self, event: &str) -> Result<Vec<StoredWebhook>, StoreError> {
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self.list_webhooks(after.as_deref(), 200).await?;
            let done = page.len() < 200;
            after = page.last().map(|h| h.id.clone());
            all.extend(page.into_iter().filter(|h| h.events.iter().any(|e| e == event)));
            if done {
                return Ok(all);
            }
        }
    }

    pub async fn delete_webhook(&self, id: &str) -> Result<bool, StoreError> {
        self.registry_delete(EntryKind::Webhooks, id).await
    }

    /// Creates or replaces an MCP server's registration; returns whether it is new.
    pub async fn put_mcp_server(&self, server: &StoredMcpServer) -> Result<bool, StoreError> {
        self.registry_put(EntryKind::McpServers, &server.name, server).await
    }

    pub async fn get_mcp_server(&self, name: &str) -> Result<Option<StoredMcpServer>, StoreError> {
        self.registry_get(EntryKind::McpServers, name).await
    }

    /// MCP servers in name order after `after`, at most `limit`.
    pub async fn list_mcp_servers(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<StoredMcpServer>, StoreError> {
        self.registry_list(EntryKind::McpServers, after, limit).await
    }

    pub async fn delete_mcp_server(&self, name: &str) -> Result<bool, StoreError> {
        self.registry_delete(EntryKind::McpServers, name).await
    }
}
