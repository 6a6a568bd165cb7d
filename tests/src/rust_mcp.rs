//! An MCP tool server on the official Rust SDK (`rmcp`), in this process on loopback: the demo's
//! order lookup and the bench's MCP tool, so neither needs Python or Node. Its one tool,
//! `lookup_order`, answers `{order_id, status}` as structured content at once, as cheaply as the
//! bench's callback receiver answers, so a bench comparing the two measures the fleet's paths.
//! Started [`RustMcpServer::with_total`], it also lists `order_total`, whose `outputSchema` it keeps
//! only for the order `good`: a server breaking its own tool's contract.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// The one tool's name.
pub const TOOL: &str = "lookup_order";
/// The tool with an `outputSchema` (`{total: number}`), answered as `{"total": "n/a"}` but for `good`.
pub const TOTAL_TOOL: &str = "order_total";

#[derive(Clone)]
struct Orders {
    calls: Arc<AtomicU64>,
    with_total: bool,
}

impl ServerHandler for Orders {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = object(json!({"type": "object", "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"]}));
        let mut tool = Tool::new(TOOL, "Looks an order up by its id: its status.", schema);
        tool.annotations = Some(ToolAnnotations::from_raw(None, Some(true), Some(false), Some(true), Some(false)));
        let mut tools = vec![tool];
        if self.with_total {
            let input = object(json!({"type": "object", "properties": {"order_id": {"type": "string"}}}));
            let output =
                object(json!({"type": "object", "properties": {"total": {"type": "number"}}, "required": ["total"]}));
            let mut total = Tool::new(TOTAL_TOOL, "An order's total.", input);
            total.output_schema = Some(Arc::new(output));
            tools.push(total);
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let order = request.arguments.as_ref().and_then(|a| a.get("order_id")).cloned().unwrap_or(Value::Null);
        if request.name == TOTAL_TOOL {
            let total = if order == "good" { json!({"total": 12.5}) } else { json!({"total": "n/a"}) };
            let mut result = CallToolResult::success(vec![ContentBlock::text(total.to_string())]);
            result.structured_content = Some(total);
            return Ok(result.into());
        }
        let found = json!({"order_id": order, "status": "shipped"});
        let mut result = CallToolResult::success(vec![ContentBlock::text(format!("order {order}: shipped"))]);
        result.structured_content = Some(found);
        Ok(result.into())
    }
}

/// A schema written as a JSON object literal, as rmcp's tools hold it.
fn object(literal: Value) -> serde_json::Map<String, Value> {
    match literal {
        Value::Object(map) => map,
        _ => unreachable!("an object literal"),
    }
}

/// A running server, stopped when dropped.
pub struct RustMcpServer {
    /// Its Streamable HTTP endpoint (`http://127.0.0.1:<port>/mcp`).
    pub url: String,
    calls: Arc<AtomicU64>,
    stop: CancellationToken,
    served: Option<tokio::task::JoinHandle<()>>,
}

impl RustMcpServer {
    pub async fn start() -> std::io::Result<Self> {
        Self::serve(false).await
    }

    /// The server listing `order_total` too (see the module's head).
    pub async fn with_total() -> std::io::Result<Self> {
        Self::serve(true).await
    }

    async fn serve(with_total: bool) -> std::io::Result<Self> {
        let stop = CancellationToken::new();
        let calls = Arc::new(AtomicU64::new(0));
        let orders = Orders { calls: calls.clone(), with_total };
        let config =
            StreamableHttpServerConfig::default().with_json_response(true).with_cancellation_token(stop.child_token());
        let service: StreamableHttpService<Orders, LocalSessionManager> =
            StreamableHttpService::new(move || Ok(orders.clone()), Default::default(), config);
        let router = axum::Router::new().nest_service("/mcp", service);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/mcp", listener.local_addr()?);
        let until = stop.clone();
        // Without TCP_NODELAY, rmcp's response (written in parts) waits out the client's delayed
        // ACK: ~40 ms a call.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let served = tokio::spawn(async move {
            let _ = axum::serve(listener, router).with_graceful_shutdown(until.cancelled_owned()).await;
        });
        Ok(RustMcpServer { url, calls, stop, served: Some(served) })
    }

    /// The `tools/call` requests it answered.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Stops serving and waits for the server's task.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(served) = self.served.take() {
            let _ = served.await;
        }
    }
}

impl Drop for RustMcpServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
