//! An MCP server's discovery: its `tools/list` read within the server's budgets, each tool checked
//! and stored as a fleet tool (`ToolExecution::Mcp`), and the tools it no longer lists removed.
//! Run at registration, on `POST /v1/mcp_servers/{name}/discover`, and on a schedule (`every`).

use fleet_protocol::approval_policy::{ApprovalSettings, Effect};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use fleet_platform::mcp::{McpClients, McpError};
use fleet_platform::now_ms;
use fleet_platform::store::{StoreError, StoredMcpServer, StoredTool};
use fleet_protocol::mcp::{DiscoveryBudget, DiscoveryError, McpTool};
use fleet_protocol::schema::ToolSchema;
use fleet_protocol::secrets::SecretsKey;
use fleet_protocol::tools::{self, McpToolRef, ToolExecution, ToolHints};

/// Conditional writes tried before a discovery gives up on a tool that keeps changing under it.
const WRITE_ATTEMPTS: usize = 5;
/// The longest description a discovered tool keeps (a registered tool's limit).
const MAX_DESCRIPTION_CHARS: usize = 4096;

/// Why a discovery stored nothing: each names its cause for the operator.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("the MCP server cannot be reached: {0}")]
    Unreachable(String),
    #[error("the URL does not answer as an MCP server: {0}")]
    NotMcp(String),
    #[error("the MCP server refused the registration's headers: {0}")]
    Unauthorized(String),
    #[error("the server's tools cannot be used: {0}")]
    Invalid(String),
    #[error("the server lists more than its discovery budget allows: {0}")]
    Budget(String),
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<McpError> for Refused {
    fn from(e: McpError) -> Self {
        let why = fleet_protocol::sanitize::sanitize_error(&e.to_string());
        match e {
            McpError::Connect { .. }
            | McpError::BadTarget { .. }
            | McpError::Lost { .. }
            | McpError::TimedOut { .. } => Refused::Unreachable(why),
            McpError::NotMcp { .. } | McpError::Rpc { .. } => Refused::NotMcp(why),
            McpError::Unauthorized { .. } => Refused::Unauthorized(why),
            McpError::Discovery { source, .. } => match source {
                DiscoveryError::TooManyPages { .. } | DiscoveryError::TooManyCapabilities { .. } => {
                    Refused::Budget(why)
                }
                _ => Refused::Invalid(why),
            },
        }
    }
}

/// What discovery needs of its process.
pub struct Discoverer<'a> {
    pub store: &'a fleet_platform::store::Store,
    pub secrets: &'a SecretsKey,
    pub clients: &'a McpClients,
}

/// The fleet tools `listed` makes of `server`'s tools, checked (pure): names the model can be
/// given, schemas that compile, no two tools of one name.
pub fn plan(server: &StoredMcpServer, listed: &[McpTool]) -> Result<Vec<StoredTool>, Refused> {
    let mut planned: Vec<StoredTool> = Vec::with_capacity(listed.len());
    for tool in listed {
        let name = fleet_name(server, &tool.name)?;
        if planned.iter().any(|t| t.name == name) {
            return Err(Refused::Invalid(format!("two of its tools would be named {name:?}")));
        }
        let parameters = tool.input_schema.clone();
        ToolSchema::compile(&parameters).map_err(|e| Refused::Invalid(format!("tool {:?}: {e}", tool.name)))?;
        let output_schema = tool.output_schema.clone();
        if let Some(schema) = &output_schema {
            ToolSchema::compile_at(schema, "outputSchema")
                .map_err(|e| Refused::Invalid(format!("tool {:?}: {e}", tool.name)))?;
        }
        let a = &tool.annotations;
        let hints = ToolHints {
            read_only: a.read_only_hint,
            destructive: a.destructive_hint,
            idempotent: a.idempotent_hint,
            open_world: a.open_world_hint,
        };
        let approvals = mcp_approvals(server, &hints);
        let execution = ToolExecution::Mcp(McpToolRef { server: server.name.clone(), tool: tool.name.clone(), hints });
        planned.push(StoredTool {
            id: String::new(),
            name,
            description: tool.description.as_deref().unwrap_or_default().chars().take(MAX_DESCRIPTION_CHARS).collect(),
            parameters,
            callback_url: server.url.clone(),
            secret_ciphertext: String::new(),
            created_at_ms: 0,
            updated_at_ms: 0,
            signing: Default::default(),
            retry: server.retry.clone(),
            limits: server.limits.clone(),
            circuit_breaker: server.circuit_breaker,
            execution,
            output_schema,
            approvals,
        });
    }
    Ok(planned)
}

/// An MCP tool's approval settings from its hints: a `destructiveHint` tool waits for an
/// operator's decision when its server's policy says so; `readOnlyHint` says it only reads.
fn mcp_approvals(server: &StoredMcpServer, hints: &ToolHints) -> ApprovalSettings {
    let effects = if hints.read_only == Some(true) { vec![Effect::Read] } else { vec![] };
    let requires_approval = hints.destructive == Some(true) && server.requires_approval_for_destructive;
    ApprovalSettings { effects, requires_approval, ..Default::default() }
}

/// The fleet name of `server`'s tool `tool`: the operator's, else `server.tool`, whose function
/// name toward the model (`server__tool`) must keep OpenAI's rule.
fn fleet_name(server: &StoredMcpServer, tool: &str) -> Result<String, Refused> {
    if let Some(mapped) = server.tool_names.get(tool) {
        return Ok(mapped.clone());
    }
    let name = tools::mcp_fleet_name(&server.name, tool);
    if tools::is_plain_tool_name(&tools::model_function_name(&name)) {
        return Ok(name);
    }
    Err(Refused::Invalid(format!(
        "tool {:?} cannot be named {name:?} (a model's function name is 1-64 letters, digits, '_' or '-' once the \
         dot is written '__'); name it in tool_names",
        fleet_protocol::sanitize::sanitize_error(tool)
    )))
}

impl Discoverer<'_> {
    /// Lists `server`'s tools and stores them; `server` records what was stored (the caller saves
    /// it). Returns the names of the tools written or removed.
    pub async fn discover(&self, server: &mut StoredMcpServer) -> Result<Vec<String>, Refused> {
        let target =
            server.target(self.secrets).map_err(|e| Refused::Invalid(format!("its headers cannot be read: {e}")))?;
        let budget = DiscoveryBudget::new(server.max_discovery_pages, server.max_capabilities)
            .map_err(|e| Refused::Invalid(e.to_string()))?;
        let listed = self.clients.list_tools(&target, budget).await?;
        let planned = plan(server, &listed)?;
        for tool in &planned {
            self.refuse_a_taken_name(server, &tool.name).await?;
        }
        let mut changed = Vec::new();
        let now = now_ms();
        for tool in planned.iter().cloned() {
            self.store_tool(tool, now).await?;
        }
        let kept: Vec<String> = planned.into_iter().map(|t| t.name).collect();
        for gone in server.tools.iter().filter(|n| !kept.contains(n)) {
            if self.owned_by(server, gone).await? {
                self.store.registry().delete_tool(gone, None).await?;
                changed.push(gone.clone());
            }
        }
        changed.extend(kept.iter().cloned());
        server.tools = kept;
        server.discovered_at_ms = now;
        server.last_error = None;
        Ok(changed)
    }

    /// Whether the tool named `name` is (still) `server`'s.
    async fn owned_by(&self, server: &StoredMcpServer, name: &str) -> Result<bool, Refused> {
        let tool = self.store.registry().get_tool(name).await?;
        Ok(tool.is_some_and(|t| t.execution.mcp().is_some_and(|m| m.server == server.name)))
    }

    async fn refuse_a_taken_name(&self, server: &StoredMcpServer, name: &str) -> Result<(), Refused> {
        let taken = self.store.registry().get_tool(name).await?;
        match taken {
            Some(t) if t.execution.mcp().is_none_or(|m| m.server != server.name) => Err(Refused::Conflict(format!(
                "a tool named {name:?} is registered already, not by this server; map its name with tool_names"
            ))),
            _ => Ok(()),
        }
    }

    /// Writes a discovered tool, keeping the id and creation time of the one it replaces.
    async fn store_tool(&self, mut tool: StoredTool, now: i64) -> Result<(), Refused> {
        for _ in 0..WRITE_ATTEMPTS {
            let current = self.store.registry().read_tool(&tool.name).await?;
            let existing = current.as_ref().map(|v| &v.tool);
            tool.id = existing.map(|t| t.id.clone()).filter(|id| !id.is_empty()).unwrap_or_else(tools::new_tool_id);
            tool.created_at_ms = existing.map_or(now, |t| t.created_at_ms);
            tool.updated_at_ms = now;
            if existing.is_some_and(|t| same_but_times(t, &tool)) {
                return Ok(());
            }
            if self.store.registry().write_tool(&tool, current.as_ref()).await? {
                return Ok(());
            }
        }
        Err(Refused::Conflict(format!("the tool {:?} kept changing while discovery wrote it", tool.name)))
    }

    /// Discovers every registered server, one after another; a failure is kept on the server's
    /// record (its tools stay as they were) and the next server is tried.
    pub async fn refresh_all(&self) {
        let mut after: Option<String> = None;
        loop {
            let page = match self.store.registry().list_mcp_servers(after.as_deref(), 100).await {
                Ok(page) => page,
                Err(e) => return tracing::warn!(error = %e, "cannot list MCP servers to discover"),
            };
            for mut server in page.iter().cloned() {
                let before = server.clone();
                if let Err(e) = self.discover(&mut server).await {
                    tracing::warn!(server = %server.name, error = %e, "MCP discovery failed; its tools are kept");
                    server.last_error = Some(fleet_protocol::sanitize::sanitize_error(&e.to_string()));
                }
                if server != before {
                    let _ = self.store.registry().put_mcp_server(&server).await;
                }
            }
            if page.len() < 100 {
                return;
            }
            after = page.last().map(|s| s.name.clone());
        }
    }
}

/// Whether `a` and `b` differ only in when they were written (a discovery that changed nothing
/// writes nothing).
fn same_but_times(a: &StoredTool, b: &StoredTool) -> bool {
    let mut b = b.clone();
    b.updated_at_ms = a.updated_at_ms;
    *a == b
}

/// Discovers every server each `interval` until `stop` fires (owned by the process's background
/// tasks, which await it at shutdown).
pub async fn every(
    store: fleet_platform::store::Store,
    secrets: SecretsKey,
    clients: std::sync::Arc<McpClients>,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let discoverer = Discoverer { store: &store, secrets: &secrets, clients: &clients };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = discoverer.refresh_all() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_protocol::mcp::McpToolHints;
    use serde_json::json;
    use serde_json::Value;

    fn server() -> StoredMcpServer {
        serde_json::from_value(json!({"name": "files", "url": "http://m.example/mcp", "max_discovery_pages": 10,
            "max_capabilities": 100, "created_at_ms": 1, "updated_at_ms": 1}))
        .unwrap()
    }

    fn tool(name: &str, schema: Value) -> McpTool {
        McpTool {
            name: name.into(),
            description: Some("d".into()),
            input_schema: schema,
            output_schema: None,
            annotations: McpToolHints { idempotent_hint: Some(true), ..Default::default() },
        }
    }

    #[test]
    fn tools_become_server_dot_tool_with_their_schema_and_hints() {
        let planned = plan(&server(), &[tool("read", json!({"type": "object"}))]).unwrap();
        assert_eq!(planned[0].name, "files.read");
        assert_eq!(planned[0].parameters, json!({"type": "object"}));
        let mcp = planned[0].execution.mcp().unwrap();
        assert_eq!((mcp.server.as_str(), mcp.tool.as_str(), mcp.hints.idempotent), ("files", "read", Some(true)));
    }

    #[test]
    fn bad_names_and_schemas_are_refused_naming_the_tool() {
        let e = plan(&server(), &[tool("a/b", json!({"type": "object"}))]).unwrap_err();
        assert!(e.to_string().contains("tool_names"), "{e}");
        let e = plan(&server(), &[tool("r", json!({"type": "strnig"}))]).unwrap_err();
        assert!(e.to_string().contains("tool \"r\""), "{e}");
        let mut mapped = server();
        mapped.tool_names.insert("a/b".into(), "files.r".into());
        let e = plan(&mapped, &[tool("a/b", json!({})), tool("r", json!({}))]).unwrap_err();
        assert!(e.to_string().contains("two of its tools"), "{e}");
    }
}
