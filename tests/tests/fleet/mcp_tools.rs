//! MCP servers as durable tools: a registered server's tools become fleet tools (`server.tool`,
//! `server__tool` toward the model), and a call of one runs as a tool-call job through the
//! worker's MCP session, against the Python MCP server in `tests/mcp/fleet_tools/server.py`.
//! Registration refuses what cannot be used; headers are sent and never shown; a refresh discovers
//! a new tool; a failure the server reports reaches the model; a drop mid-call ends `unknown`
//! and is sent again only for a tool that says a repeat is harmless; a copy of a call is only acked.
//! The TypeScript SDK's server (`tests/mcp/ts/server.cjs`) takes the same path.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use fleet_protocol::external_result::ExternalResult;
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::proxy::Proxy;
use fleet_tests::tap::JobTap;
use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
use fleet_tests::{metric, spawn_fleet, wait_for, Fleet, FleetOptions, Receiver, Reply};

const TOKEN: &str = "mcp-bearer-token-4f1c9a";

/// The Python MCP server, ended when dropped.
struct McpServer {
    child: Child,
    url: String,
    http: reqwest::Client,
}

impl McpServer {
    /// Starts it requiring `Authorization: Bearer TOKEN`; its URL is its first line of output.
    fn start() -> Self {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/mcp/fleet_tools/server.py");
        let venv = std::env::var("HOME").map(|h| format!("{h}/.cache/fleet-mcp/venv/bin/python")).unwrap_or_default();
        let python = if std::path::Path::new(&venv).exists() { venv } else { "python3".into() };
        let mut child =
            Command::new(python).arg(script).arg(TOKEN).stdout(Stdio::piped()).spawn().expect("python3 runs");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("the server's URL");
        let url = serde_json::from_str::<Value>(&line).expect("a JSON line")["url"].as_str().unwrap().to_string();
        McpServer { child, url, http: reqwest::Client::new() }
    }

    fn base(&self) -> &str {
        self.url.trim_end_matches("/mcp")
    }

    async fn state(&self) -> Value {
        self.http.get(format!("{}/state", self.base())).send().await.unwrap().json().await.unwrap()
    }

    async fn calls(&self, tool: &str) -> u64 {
        self.state().await["calls"][tool].as_u64().unwrap_or(0)
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn registration(name: &str, url: &str) -> Value {
    json!({"name": name, "url": url, "headers": {"Authorization": format!("Bearer {TOKEN}")}})
}

/// The tool-call execution a turn's call became, found by its tool's name.
async fn call_record(fleet: &Fleet, turn: &Value, tool: &str) -> Value {
    let call = turn["turn"]["tool_calls"].as_array().unwrap().iter().find(|c| c["tool_name"] == tool).unwrap().clone();
    let id = call["execution_id"].as_str().unwrap_or_else(|| panic!("{call}"));
    fleet.get(&format!("/v1/executions/{id}")).await.1["data"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_discovers_tools_refuses_what_is_no_mcp_server_and_never_shows_headers() {
    let server = McpServer::start();
    let not_mcp = Receiver::start("whsec_not_an_mcp_server_01", |_, _| Reply::status(404)).await;
    // Every registered server is discovered again each second.
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_MCP_DISCOVERY_INTERVAL", "1")).await;

    // Nothing listens there; a plain web server; the right server without its token.
    // (The client reads a refused connection as "not an MCP server" for now: either names it.)
    let (status, body) = fleet.post("/v1/mcp_servers", &registration("gone", "http://127.0.0.1:9/mcp")).await;
    let code = body["error"]["code"].as_str().unwrap_or_default();
    assert_eq!(status, 422, "{body}");
    assert!(["mcp_unreachable", "mcp_not_a_server"].contains(&code), "{body}");
    let (status, body) = fleet.post("/v1/mcp_servers", &registration("web", &not_mcp.url("/mcp"))).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("mcp_not_a_server")), "{body}");
    let (status, body) = fleet.post("/v1/mcp_servers", &json!({"name": "anon", "url": server.url})).await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = fleet.post("/v1/mcp_servers", &json!({"name": "x.y", "url": server.url})).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(fleet.get("/v1/mcp_servers").await.1["data"], json!([]), "nothing refused was stored");

    let (status, body) = fleet.post("/v1/mcp_servers", &registration("fleet", &server.url)).await;
    assert_eq!(status, 201, "{body}");
    let mut tools: Vec<String> = serde_json::from_value(body["data"]["tools"].clone()).unwrap();
    tools.sort();
    assert_eq!(tools, ["fleet.echo", "fleet.explode", "fleet.set_value", "fleet.write_once"]);
    let (status, again) = fleet.post("/v1/mcp_servers", &registration("fleet", &server.url)).await;
    assert_eq!((status, again["error"]["code"].as_str()), (409, Some("mcp_server_exists")), "{again}");

    // Shown by header name only, here and among the tools.
    let (_, shown) = fleet.get("/v1/mcp_servers/fleet").await;
    assert_eq!(shown["data"]["header_names"], json!(["Authorization"]));
    let (_, listed) = fleet.get("/v1/tools").await;
    for text in [shown.to_string(), listed.to_string(), fleet.get("/v1/mcp_servers").await.1.to_string()] {
        assert!(!text.contains(TOKEN), "the token is never shown: {text}");
    }
    let echo = listed["data"].as_array().unwrap().iter().find(|t| t["name"] == "fleet.echo").unwrap().clone();
    assert_eq!(echo["execution"]["mcp"]["tool"], "echo", "{echo}");
    assert_eq!(echo["parameters"]["required"], json!(["text"]), "its inputSchema is its parameters");
    let state = server.state().await;
    let seen = state["authorizations"].as_array().unwrap();
    assert!(seen.iter().any(|a| a == &json!(format!("Bearer {TOKEN}"))), "{state}");

    // A tool the server adds is discovered on schedule, and on demand.
    server.http.post(format!("{}/add_tool", server.base())).send().await.unwrap();
    wait_for("the scheduled discovery found the new tool", Duration::from_secs(20), || async {
        (fleet.get("/v1/tools/fleet.added").await.0 == 200).then_some(())
    })
    .await;
    let (status, body) = fleet.post("/v1/mcp_servers/fleet/discover", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["data"]["tools"].as_array().unwrap().contains(&json!("fleet.added")), "{body}");
    assert_eq!(fleet.get("/v1/tools/fleet.added").await.0, 200);

    // Deleting the server deletes its tools.
    assert_eq!(fleet.request(reqwest::Method::DELETE, "/v1/mcp_servers/fleet", None).await.0, 204);
    assert_eq!(fleet.get("/v1/tools/fleet.echo").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_models_mcp_call_runs_as_a_job_and_the_model_reads_its_observation() {
    let server = McpServer::start();
    let llm = MockLlm::start(|body, _| {
        let tool_messages = body["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "tool").count();
        if tool_messages == 0 {
            LlmReply::ToolCalls(vec![
                ("call_echo".into(), "fleet__echo".into(), r#"{"text":"hi"}"#.into()),
                ("call_boom".into(), "fleet__explode".into(), r#"{"reason":"bad"}"#.into()),
            ])
        } else {
            LlmReply::text("Done.")
        }
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let (status, body) = fleet.post("/v1/mcp_servers", &registration("fleet", &server.url)).await;
    assert_eq!(status, 201, "{body}");

    let id = post_turn(&fleet, &turn_body("s_mcp", "echo hi", &["fleet.echo", "fleet.explode"])).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["turn"]["final_message"]["content"], "Done.");

    // The model was offered `server__tool` and read each call's observation.
    let first = &llm.requests()[0];
    let offered: Vec<&str> =
        first.body["tools"].as_array().unwrap().iter().filter_map(|t| t["function"]["name"].as_str()).collect();
    assert!(offered.contains(&"fleet__echo") && offered.contains(&"fleet__explode"), "{offered:?}");
    let second = &llm.requests()[1];
    let tools: Vec<Value> = second.messages().into_iter().filter(|m| m["role"] == "tool").collect();
    let by_id = |id: &str| tools.iter().find(|m| m["tool_call_id"] == id).unwrap()["content"].clone();
    let echo = call_record(&fleet, &done, "fleet.echo").await;
    let result: ExternalResult = serde_json::from_value(echo["external_result"].clone()).unwrap();
    assert_eq!(by_id("call_echo"), result.observation_text());
    assert!(by_id("call_echo").as_str().unwrap().contains("echo: hi"));
    let failed = by_id("call_boom").as_str().unwrap().to_string();
    assert!(failed.contains("failed") && failed.contains("MCP_TOOL_ERROR"), "{failed}");

    // The records keep the ExternalResult; the failure was not sent again.
    let shown = |r: &Value| (r["status"].as_str().map(str::to_string), r["external_result"]["status"].as_str().map(str::to_string));
    assert_eq!(shown(&echo), (Some("succeeded".into()), Some("success".into())));
    assert_eq!(echo["external_result"]["source"], "fleet:echo");
    let boom = call_record(&fleet, &done, "fleet.explode").await;
    assert_eq!(shown(&boom), (Some("failed".into()), Some("failed".into())), "{boom}");
    assert_eq!(server.calls("explode").await, 1);
    assert_eq!(server.calls("echo").await, 1);
}

/// Freezes the server's answers, calls `tool`, waits until the server ran it, then cuts the
/// connection: the worker sent the call and never heard back.
async fn call_and_drop(fleet: &Fleet, server: &McpServer, proxy: &Proxy, tool: &str) -> String {
    // A plain call first: the worker's session is open before the answers are held (a lost
    // connection ends a session, and a handshake held would leave the call unsent).
    let warm = fleet.call_tool("fleet.echo", json!({"text": "warm"})).await;
    fleet.wait_status(&warm, "succeeded", Duration::from_secs(20)).await;
    let before = server.calls(tool).await;
    proxy.freeze_replies();
    let id = fleet.call_tool(&format!("fleet.{tool}"), json!({"key": "k"})).await;
    wait_for("the server ran the call", Duration::from_secs(20), || async {
        (server.calls(tool).await > before).then_some(())
    })
    .await;
    proxy.cut();
    proxy.thaw();
    proxy.restore();
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_mid_call_ends_unknown_unless_the_tool_is_idempotent_and_a_copy_is_only_acked() {
    let server = McpServer::start();
    let upstream = server.url.trim_start_matches("http://").split('/').next().unwrap().parse().unwrap();
    let proxy = Proxy::start(upstream).await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_RETRY_DELAYS", "0.2,0.4,0.8")).await;
    let url = format!("http://{}/mcp", proxy.addr);
    let (status, body) = fleet.post("/v1/mcp_servers", &registration("fleet", &url)).await;
    assert_eq!(status, 201, "{body}");
    let tap = JobTap::start(&fleet).await;

    // A plain call, which opens the worker's session; then a copy of its job changes nothing.
    let echo = fleet.call_tool("fleet.echo", json!({"text": "warm"})).await;
    let done = fleet.wait_status(&echo, "succeeded", Duration::from_secs(20)).await;
    assert!(done["external_result"].to_string().contains("echo: warm"), "{done}");
    let job = tap.first("the echo call's job", |t| t.execution_id() == echo).await;
    tap.republish(&job).await;
    wait_for("the copy acked", Duration::from_secs(20), || async {
        let text = fleet.worker_metrics(0).await;
        (metric(&text, "fleet_duplicate_deliveries_total{kind=\"tool_call\"}") >= 1.0).then_some(())
    })
    .await;
    assert_eq!(server.calls("echo").await, 1, "the copy sent nothing");
    assert_eq!(fleet.get(&format!("/v1/executions/{echo}")).await.1["data"]["attempts"].as_array().map(Vec::len), Some(1));

    // Not idempotent: the unknown outcome ends the call, to be reconciled, never sent again.
    let id = call_and_drop(&fleet, &server, &proxy, "write_once").await;
    let ended = fleet.wait_status(&id, "failed", Duration::from_secs(20)).await;
    assert_eq!(ended["external_result"]["status"], "unknown", "{ended}");
    assert_eq!(ended["external_result"]["error"]["code"], "MCP_OUTCOME_UNKNOWN");
    assert_eq!(ended["attempts"].as_array().map(Vec::len), Some(1), "{ended}");
    assert_eq!(server.calls("write_once").await, 1);

    // Idempotent (`idempotentHint`): sent again, and it succeeds.
    let id = call_and_drop(&fleet, &server, &proxy, "set_value").await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    assert!(done["external_result"].to_string().contains("set k"), "{done}");
    assert_eq!(server.calls("set_value").await, 2);
    tap.close().await;
}

/// The same path against the official TypeScript SDK's server: a model's call of `ts.multiply`
/// runs as a job and the model reads its structured result; the tool's failure reaches it as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typescript_sdk_servers_tools_run_as_jobs() {
    let server = fleet_tests::mcp::McpTestServer::typescript().await;
    let llm = MockLlm::start(|body, _| {
        if body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool") {
            LlmReply::text("42 it is.")
        } else {
            LlmReply::ToolCalls(vec![
                ("call_mul".into(), "ts__multiply".into(), r#"{"a":6,"b":7}"#.into()),
                ("call_fail".into(), "ts__fail".into(), r#"{"id":"o-9"}"#.into()),
            ])
        }
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let (status, body) = fleet.post("/v1/mcp_servers", &json!({"name": "ts", "url": server.url})).await;
    assert_eq!(status, 201, "{body}");
    let id = post_turn(&fleet, &turn_body("s_mcp_ts", "multiply", &["ts.multiply", "ts.fail"])).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    let second = &llm.requests()[1];
    let tools: Vec<Value> = second.messages().into_iter().filter(|m| m["role"] == "tool").collect();
    let by_id = |id: &str| tools.iter().find(|m| m["tool_call_id"] == id).unwrap()["content"].clone();
    let product = call_record(&fleet, &done, "ts.multiply").await;
    assert_eq!(product["external_result"]["structuredContent"], json!({"product": 42}), "{product}");
    assert_eq!(product["external_result"]["source"], "ts:multiply");
    assert!(by_id("call_mul").as_str().unwrap().contains("42"), "{}", by_id("call_mul"));
    let failed = call_record(&fleet, &done, "ts.fail").await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["external_result"]["status"], "failed");
    assert_eq!(failed["external_result"]["error"]["code"], "NOT_FOUND", "the tool's own safe error: {failed}");
    assert!(by_id("call_fail").as_str().unwrap().contains("failed: error NOT_FOUND"), "{}", by_id("call_fail"));
    assert_eq!(server.count("tools/call").await, 2, "each call sent once");
}

/// A tool with an `outputSchema` promises structured content that conforms (MCP: servers MUST,
/// clients SHOULD check): an answer that breaks it ends the call `failed` with
/// `MCP_OUTPUT_INVALID`, its content kept for the record; one that keeps it succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_breaking_its_tools_output_schema_fails_the_call() {
    let server = fleet_tests::rust_mcp::RustMcpServer::with_total().await.unwrap();
    let fleet = spawn_fleet(FleetOptions::default()).await;
    let (status, body) = fleet.post("/v1/mcp_servers", &json!({"name": "orders", "url": server.url})).await;
    assert_eq!(status, 201, "{body}");
    let tool = fleet.get("/v1/tools/orders.order_total").await.1;
    assert_eq!(tool["data"]["output_schema"]["required"], json!(["total"]), "{tool}");

    let good = fleet.call_tool("orders.order_total", json!({"order_id": "good"})).await;
    let done = fleet.wait_status(&good, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(done["external_result"]["structuredContent"], json!({"total": 12.5}), "{done}");

    let bad = fleet.call_tool("orders.order_total", json!({"order_id": "o-1"})).await;
    let ended = fleet.wait_status(&bad, "failed", Duration::from_secs(20)).await;
    let result = &ended["external_result"];
    assert_eq!(result["status"], "failed", "{ended}");
    assert_eq!(result["error"]["code"], "MCP_OUTPUT_INVALID", "{ended}");
    assert_eq!(result["structuredContent"], json!({"total": "n/a"}), "its content kept: {ended}");
    assert_eq!(ended["attempts"].as_array().map(Vec::len), Some(1), "not retried: {ended}");
    assert_eq!(server.calls(), 2);
    server.stop().await;
}
