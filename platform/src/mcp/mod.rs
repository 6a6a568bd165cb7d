//! The fleet's MCP client (seed 002's `McpClient`): tools discovered and called over Streamable
//! HTTP with rmcp, one initialized session per server reused across calls. The rules it applies
//! (budgets, cursors, names, schemas, results) are `fleet_protocol::mcp`'s.

mod error;
mod session;

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use fleet_protocol::external_result::ExternalResult;
use fleet_protocol::mcp::{
    self as rules, CursorTrail, DiscoveryBudget, DiscoveryProgress, McpTool, McpToolHints, NextPage,
};
use rmcp::model::{CallToolRequestParams, PaginatedRequestParams, Tool};
use rmcp::service::ServiceError;
use serde_json::{Map, Value};
use tokio::sync::Mutex;

pub use error::McpError;
use error::{chain, failure_kind, scrub, FailureKind};
use session::Session;

/// How long opening a session may take, at most (a call's own deadline may be shorter).
pub const INIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one `tools/list` page may take.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(30);
/// How many sessions one client keeps open; past it the cache is emptied and refilled.
const MAX_SESSIONS: usize = 256;

/// An MCP server as the client reaches it. `headers` are sent with every request, already
/// decrypted (an `Authorization`, say): they never appear in an error or a `Debug` print.
#[derive(Clone, PartialEq, Eq)]
pub struct McpServerTarget {
    pub name: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
}

impl std::fmt::Debug for McpServerTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("McpServerTarget")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("headers", &names)
            .finish()
    }
}

impl McpServerTarget {
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Self {
        McpServerTarget { name: name.into(), url: url.into(), headers: vec![] }
    }

    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The header values and their parts (a bearer's token without `Bearer `), to scrub.
    fn secrets(&self) -> Vec<String> {
        let mut secrets = Vec::new();
        for (_, value) in &self.headers {
            secrets.push(value.clone());
            secrets.extend(value.split_whitespace().map(str::to_string));
        }
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets
    }

    /// The session cache's key: name, URL and headers (a changed token is a new session).
    fn key(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        (&self.name, &self.url, &self.headers).hash(&mut hasher);
        hasher.finish()
    }
}

/// How a `tools/call` ended, by what the caller may do next.
#[derive(Debug, Clone, PartialEq)]
pub enum CallAnswer {
    /// The server answered: a success, or a failure (`isError`) as seed 002's `ExternalResult`.
    Answered(ExternalResult),
    /// The request was never sent (no session could be opened): safe to retry.
    Unsent(McpError),
    /// The request was sent and no answer came (the connection dropped, or the answer was not
    /// readable). MCP has no idempotency key: the caller decides whether trying again is safe.
    Unknown(McpError),
    /// The deadline passed after the request was sent (it was cancelled, but may have acted).
    TimedOut,
}

impl CallAnswer {
    /// The answer as seed 002's `ExternalResult`: `failed` (retryable) when unsent, `unknown` when
    /// unanswered, `timeout` when late.
    pub fn into_result(self, call_id: &str, server: &str, tool: &str) -> ExternalResult {
        match self {
            CallAnswer::Answered(result) => result,
            CallAnswer::Unsent(e) => rules::unsent_result(call_id, server, tool, &e.summary()),
            CallAnswer::Unknown(e) => rules::unknown_result(call_id, server, tool, &e.summary()),
            CallAnswer::TimedOut => rules::timeout_result(call_id, server, tool),
        }
    }
}

/// A session's slot: filled once, emptied when its session fails.
type Slot = Arc<Mutex<Option<Arc<Session>>>>;

/// The fleet's MCP client: a cache of initialized sessions, one per target, reused by every call
/// and listing. A session that fails is dropped and opened again on the next use.
#[derive(Default)]
pub struct McpClients {
    slots: std::sync::Mutex<HashMap<u64, Slot>>,
}

impl McpClients {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every tool the server lists, paging through `tools/list` by `nextCursor` within `budget`.
    pub async fn list_tools(
        &self,
        target: &McpServerTarget,
        budget: DiscoveryBudget,
    ) -> Result<Vec<McpTool>, McpError> {
        self.list_tools_within(target, &mut DiscoveryProgress::new(budget)).await
    }

    /// [`Self::list_tools`] counting against a discovery that spans several servers.
    pub async fn list_tools_within(
        &self,
        target: &McpServerTarget,
        progress: &mut DiscoveryProgress,
    ) -> Result<Vec<McpTool>, McpError> {
        let discovery = |source| McpError::Discovery { server: target.name.clone(), source };
        let session = self.session(target, INIT_TIMEOUT).await?;
        let mut trail = CursorTrail::default();
        let mut tools = Vec::new();
        let mut cursor = None;
        loop {
            progress.may_fetch().map_err(discovery)?;
            let params = PaginatedRequestParams::default().with_cursor(cursor.take());
            let page = match tokio::time::timeout(LIST_TIMEOUT, session.peer().list_tools(Some(params))).await {
                Ok(Ok(page)) => page,
                Ok(Err(e)) => return Err(self.failed(target, &session, "tools/list", &e).await),
                Err(_) => {
                    self.forget(target, &session).await;
                    return Err(McpError::TimedOut { server: target.name.clone(), method: "tools/list" });
                }
            };
            let next = progress.page(&target.name, &mut trail, page.tools.len(), page.next_cursor.as_deref());
            tools.extend(page.tools.iter().map(tool_of));
            match next.map_err(discovery)? {
                NextPage::Fetch(next) => cursor = Some(next),
                NextPage::Done => break,
            }
        }
        rules::check_tools(&target.name, &tools).map_err(discovery)?;
        Ok(tools)
    }

    /// Calls `tool` once with `arguments`, within `timeout` (the handshake included when the
    /// session must be opened first). Never retries a request that was sent.
    pub async fn call_tool(
        &self,
        target: &McpServerTarget,
        tool: &str,
        arguments: Map<String, Value>,
        call_id: &str,
        timeout: Duration,
    ) -> CallAnswer {
        let started = tokio::time::Instant::now();
        let session = match self.session(target, timeout.min(INIT_TIMEOUT)).await {
            Ok(session) => session,
            Err(e) => return CallAnswer::Unsent(e),
        };
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        let left = timeout.saturating_sub(started.elapsed());
        // Dropping the call on the deadline sends `notifications/cancelled` (rmcp's guard).
        match tokio::time::timeout(left, session.peer().call_tool(params)).await {
            Ok(Ok(answer)) => {
                let answer = serde_json::to_value(&answer).unwrap_or(Value::Null);
                CallAnswer::Answered(rules::call_result(call_id, &target.name, tool, &answer))
            }
            Ok(Err(e)) => match self.failed(target, &session, "tools/call", &e).await {
                e @ McpError::Rpc { .. } => {
                    let result = rules::call_result(call_id, &target.name, tool, &rpc_error_answer(&e));
                    CallAnswer::Answered(result)
                }
                e if e.unsent() => CallAnswer::Unsent(e),
                e => CallAnswer::Unknown(e),
            },
            Err(_) => CallAnswer::TimedOut,
        }
    }

    /// The target's session, opened when there is none (one handshake at a time per target).
    async fn session(&self, target: &McpServerTarget, deadline: Duration) -> Result<Arc<Session>, McpError> {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            if slots.len() >= MAX_SESSIONS && !slots.contains_key(&target.key()) {
                slots.clear();
            }
            slots.entry(target.key()).or_default().clone()
        };
        let mut held = slot.lock().await;
        if let Some(session) = held.as_ref().filter(|s| !s.is_transport_closed()) {
            return Ok(session.clone());
        }
        let session = Arc::new(session::open(target, deadline).await?);
        *held = Some(session.clone());
        Ok(session)
    }

    /// Drops `session` from the cache (unless it was replaced already): the next use opens anew.
    async fn forget(&self, target: &McpServerTarget, session: &Arc<Session>) {
        let slot = self.slots.lock().unwrap_or_else(|p| p.into_inner()).get(&target.key()).cloned();
        if let Some(slot) = slot {
            let mut held = slot.lock().await;
            if held.as_ref().is_some_and(|s| Arc::ptr_eq(s, session)) {
                *held = None;
            }
        }
    }

    /// A request's failure as an `McpError`; a failure of the session itself forgets it.
    async fn failed(
        &self,
        target: &McpServerTarget,
        session: &Arc<Session>,
        method: &'static str,
        e: &ServiceError,
    ) -> McpError {
        let server = target.name.clone();
        if let ServiceError::McpError(data) = e {
            return McpError::Rpc { server, method, detail: scrub(&data.message, &target.secrets()) };
        }
        self.forget(target, session).await;
        // rmcp's transport error does not chain its cause: read from the transport's own error on.
        let cause: &(dyn std::error::Error + 'static) = match e {
            ServiceError::TransportSend(transport) => transport.error.as_ref(),
            other => other,
        };
        let detail = scrub(&chain(cause), &target.secrets());
        match failure_kind(cause) {
            FailureKind::Connect => McpError::Connect { server, detail },
            FailureKind::Unauthorized => McpError::Unauthorized { server },
            FailureKind::NotMcp | FailureKind::Lost => McpError::Lost { server, method, detail },
        }
    }
}

/// A JSON-RPC error to `tools/call` (an unknown tool, bad arguments) is an answer: the tool
/// failed. As an `isError` answer, so it is read the one way.
fn rpc_error_answer(error: &McpError) -> Value {
    let detail = match error {
        McpError::Rpc { detail, .. } => detail.as_str(),
        _ => "",
    };
    serde_json::json!({"isError": true, "content": [{"type": "text", "text": detail}]})
}

/// rmcp's tool as the fleet's: schemas as JSON, hints as booleans.
fn tool_of(tool: &Tool) -> McpTool {
    let hints = tool.annotations.as_ref();
    McpTool {
        name: tool.name.to_string(),
        description: tool.description.as_ref().map(|d| d.to_string()),
        input_schema: Value::Object((*tool.input_schema).clone()),
        output_schema: tool.output_schema.as_ref().map(|s| Value::Object((**s).clone())),
        annotations: McpToolHints {
            read_only_hint: hints.and_then(|h| h.read_only_hint),
            destructive_hint: hints.and_then(|h| h.destructive_hint),
            idempotent_hint: hints.and_then(|h| h.idempotent_hint),
            open_world_hint: hints.and_then(|h| h.open_world_hint),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_and_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: T) {}

    /// The dispatcher and the worker hold one client in shared state and call it from spawned
    /// tasks: it and its futures must cross threads.
    #[test]
    fn the_client_and_its_futures_cross_threads() {
        let clients = McpClients::new();
        send_and_sync(&clients);
        let target = McpServerTarget::new("s", "http://127.0.0.1:9/mcp").header("Authorization", "Bearer secret-value");
        send(clients.list_tools(&target, DiscoveryBudget::default()));
        send(clients.call_tool(&target, "t", Map::new(), "c", Duration::from_secs(1)));
        assert!(!format!("{target:?}").contains("secret-value"));
    }
}
