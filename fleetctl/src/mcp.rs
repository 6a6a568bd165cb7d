//! `fleetctl mcp`: list and call an MCP server's tools with the fleet's own client
//! (`fleet_platform::mcp`), and the client the MCP conformance suite drives (`conformance`).

use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use fleet_platform::mcp::{CallAnswer, McpClients, McpServerTarget};
use fleet_protocol::mcp::DiscoveryBudget;
use serde_json::{json, Map, Value};

#[derive(Subcommand)]
pub enum McpAction {
    /// Every tool the server lists (paged by `nextCursor`), as JSON.
    List {
        #[command(flatten)]
        server: ServerArgs,
        #[arg(long, default_value_t = fleet_protocol::mcp::DEFAULT_MAX_DISCOVERY_PAGES)]
        max_pages: u32,
        #[arg(long, default_value_t = fleet_protocol::mcp::DEFAULT_MAX_CAPABILITIES)]
        max_capabilities: u32,
    },
    /// Calls one tool and prints seed 002's ExternalResult; exits 1 unless it succeeded.
    Call {
        #[command(flatten)]
        server: ServerArgs,
        #[arg(long)]
        tool: String,
        /// The arguments, a JSON object.
        #[arg(long, default_value = "{}")]
        args: String,
        #[arg(long, default_value = "fleetctl-1")]
        call_id: String,
        #[arg(long, default_value_t = 60)]
        timeout_secs: u64,
    },
    /// The client of the MCP conformance suite's client mode: it passes the URL last and the
    /// scenario in `MCP_CONFORMANCE_SCENARIO`. Initializes, lists the tools and calls each.
    Conformance { url: String },
}

#[derive(Args)]
pub struct ServerArgs {
    /// The server's Streamable HTTP endpoint.
    #[arg(long)]
    url: String,
    /// The server's name (a result's source is `<name>:<tool>`).
    #[arg(long, default_value = "mcp")]
    name: String,
    /// A header sent with every request, `Name: value` (repeatable).
    #[arg(long = "header")]
    headers: Vec<String>,
}

impl ServerArgs {
    fn target(&self) -> anyhow::Result<McpServerTarget> {
        let mut target = McpServerTarget::new(&self.name, &self.url);
        for header in &self.headers {
            let (name, value) = header.split_once(':').context("a --header is `Name: value`")?;
            target = target.header(name.trim(), value.trim());
        }
        Ok(target)
    }
}

pub async fn run(action: McpAction) -> anyhow::Result<()> {
    let clients = McpClients::new();
    match action {
        McpAction::List { server, max_pages, max_capabilities } => {
            let budget = DiscoveryBudget::new(max_pages, max_capabilities)?;
            let tools = clients.list_tools(&server.target()?, budget).await?;
            println!("{}", serde_json::to_string_pretty(&tools)?);
            Ok(())
        }
        McpAction::Call { server, tool, args, call_id, timeout_secs } => {
            let arguments: Map<String, Value> = serde_json::from_str(&args).context("--args is not a JSON object")?;
            let target = server.target()?;
            let timeout = Duration::from_secs(timeout_secs);
            let answer = clients.call_tool(&target, &tool, arguments, &call_id, timeout).await;
            let result = answer.into_result(&call_id, &target.name, &tool);
            println!("{}", serde_json::to_string_pretty(&result)?);
            if !result.is_success() {
                std::process::exit(1);
            }
            Ok(())
        }
        McpAction::Conformance { url } => conformance(&clients, &url).await,
    }
}

/// What every client scenario needs of a client: a session, its tools, and a call of each with
/// arguments its schema accepts. A call the server could not answer fails the run.
async fn conformance(clients: &McpClients, url: &str) -> anyhow::Result<()> {
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    eprintln!("fleetctl mcp conformance: scenario {scenario:?} at {url}");
    let target = McpServerTarget::new("conformance", url);
    let tools = clients.list_tools(&target, DiscoveryBudget::default()).await?;
    for (n, tool) in tools.iter().enumerate() {
        let arguments = sample_arguments(&tool.input_schema);
        let call_id = format!("conformance-{n}");
        match clients.call_tool(&target, &tool.name, arguments, &call_id, Duration::from_secs(20)).await {
            CallAnswer::Answered(result) => println!("{}", serde_json::to_string(&result)?),
            other => bail!("tool {}: {:?}", tool.name, other),
        }
    }
    Ok(())
}

/// Arguments for a tool from its input schema: each required property given a value of its type.
fn sample_arguments(schema: &Value) -> Map<String, Value> {
    let required = schema.get("required").and_then(Value::as_array).cloned().unwrap_or_default();
    let properties = schema.get("properties").and_then(Value::as_object);
    let mut arguments = Map::new();
    for name in required.iter().filter_map(Value::as_str) {
        let kind = properties.and_then(|p| p.get(name)).and_then(|p| p.get("type")).and_then(Value::as_str);
        let value = match kind {
            Some("number") | Some("integer") => json!(n_for(arguments.len())),
            Some("boolean") => json!(true),
            Some("array") => json!([]),
            Some("object") => json!({}),
            _ => json!("conformance"),
        };
        arguments.insert(name.to_string(), value);
    }
    arguments
}

/// 5, 3, 1, …: distinct small numbers, so a sum shows both operands.
fn n_for(index: usize) -> i64 {
    5 - 2 * index as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_arguments_follow_the_schema() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}, "s": {"type": "string"}}, "required": ["a", "b"]});
        assert_eq!(Value::Object(sample_arguments(&schema)), json!({"a": 5, "b": 3}));
    }
}
