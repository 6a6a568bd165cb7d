//! The fleet's MCP client (`fleet_platform::mcp`) against real servers on the official SDKs
//! (`tests/mcp/`): discovery paged by cursor within its budgets, a repeated cursor and an invalid
//! schema refused, `isError` as a failed result, structured content kept, a late call timed out,
//! a dropped connection unknown, a URL that is no MCP server named as such, bearer auth, and one
//! `initialize` per server however many calls follow.

use std::time::Duration;

use fleet_platform::mcp::{CallAnswer, McpClients, McpError, McpServerTarget};
use fleet_protocol::external_result::{ExternalResult, ResultStatus};
use fleet_protocol::mcp::{checked_output, DiscoveryBudget, DiscoveryError, MCP_TOOL_ERROR};
use fleet_tests::mcp::McpTestServer;
use serde_json::{json, Map, Value};

const CALL_TIMEOUT: Duration = Duration::from_secs(20);

fn args(value: Value) -> Map<String, Value> {
    value.as_object().expect("arguments are an object").clone()
}

fn target(server: &McpTestServer) -> McpServerTarget {
    McpServerTarget::new("files", &server.url)
}

async fn answered(clients: &McpClients, target: &McpServerTarget, tool: &str, arguments: Value) -> ExternalResult {
    match clients.call_tool(target, tool, args(arguments), "call-1", CALL_TIMEOUT).await {
        CallAnswer::Answered(result) => result,
        other => panic!("{tool} was not answered: {other:?}"),
    }
}

#[tokio::test]
async fn discovery_pages_through_the_whole_listing() {
    let server = McpTestServer::python("paged", &["--tools", "25", "--page-size", "10"]).await;
    let clients = McpClients::new();
    let tools = clients.list_tools(&target(&server), DiscoveryBudget::default()).await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names.len(), 25, "{names:?}");
    assert_eq!((names[0], names[24]), ("tool_0000", "tool_0024"));
    assert_eq!(server.count("tools/list").await, 3);
    // Exactly at the budget is whole.
    let exact = DiscoveryBudget::new(3, 25).unwrap();
    assert_eq!(clients.list_tools(&target(&server), exact).await.unwrap().len(), 25);
}

#[tokio::test]
async fn a_listing_past_its_budget_fails_and_is_never_cut() {
    let server = McpTestServer::python("paged", &["--tools", "25", "--page-size", "10"]).await;
    let clients = McpClients::new();
    let pages = clients.list_tools(&target(&server), DiscoveryBudget::new(2, 1000).unwrap()).await.unwrap_err();
    assert!(
        matches!(&pages, McpError::Discovery { source: DiscoveryError::TooManyPages { max: 2 }, .. }),
        "{pages}"
    );
    assert!(pages.to_string().contains("maxDiscoveryPages"), "{pages}");
    let tools = clients.list_tools(&target(&server), DiscoveryBudget::new(100, 24).unwrap()).await.unwrap_err();
    assert!(
        matches!(&tools, McpError::Discovery { source: DiscoveryError::TooManyCapabilities { max: 24 }, .. }),
        "{tools}"
    );
    assert!(tools.to_string().contains("maxCapabilities"), "{tools}");
}

#[tokio::test]
async fn a_repeated_cursor_and_an_invalid_schema_fail() {
    let looping = McpTestServer::python("repeat-cursor", &[]).await;
    let clients = McpClients::new();
    let e = clients.list_tools(&target(&looping), DiscoveryBudget::default()).await.unwrap_err();
    assert!(matches!(&e, McpError::Discovery { source: DiscoveryError::RepeatedCursor { .. }, .. }), "{e}");
    assert_eq!(looping.count("tools/list").await, 2, "the loop is seen on its second page");

    let bad = McpTestServer::python("bad-schema", &[]).await;
    let e = clients.list_tools(&target(&bad), DiscoveryBudget::default()).await.unwrap_err();
    assert!(matches!(&e, McpError::Discovery { source: DiscoveryError::InvalidSchema { .. }, .. }), "{e}");
    assert!(e.to_string().contains("tool_0001") && e.to_string().contains("inputSchema"), "{e}");
}

#[tokio::test]
async fn a_listing_keeps_schemas_and_hints() {
    let server = McpTestServer::python("tools", &[]).await;
    let tools = McpClients::new().list_tools(&target(&server), DiscoveryBudget::default()).await.unwrap();
    let tool = |name: &str| tools.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("{name} listed"));
    let lookup = tool("lookup");
    assert_eq!(lookup.annotations.read_only_hint, Some(true));
    assert_eq!(lookup.annotations.destructive_hint, Some(false));
    assert_eq!(lookup.annotations.idempotent_hint, Some(true));
    assert_eq!(lookup.annotations.open_world_hint, None);
    assert_eq!(tool("add").input_schema["properties"]["a"]["type"], "integer");
    assert!(tool("add").output_schema.is_some());
    assert_eq!(tool("echo").description.as_deref(), Some("Echoes its text, also as structured content"));

    let ts = McpTestServer::typescript().await;
    let tools = McpClients::new().list_tools(&target(&ts), DiscoveryBudget::default()).await.unwrap();
    let multiply = tools.iter().find(|t| t.name == "multiply").unwrap();
    assert_eq!(multiply.annotations.read_only_hint, Some(true));
    assert_eq!(multiply.output_schema.as_ref().unwrap()["properties"]["product"]["type"], "number");
}

#[tokio::test]
async fn answers_keep_structured_content_and_errors_are_failed() {
    let py = McpTestServer::python("tools", &[]).await;
    let ts = McpTestServer::typescript().await;
    let clients = McpClients::new();
    let (py, ts) = (target(&py), target(&ts));

    let echo = answered(&clients, &py, "echo", json!({"text": "hello"})).await;
    assert_eq!((echo.status, echo.source.as_str(), echo.call_id.as_str()), (ResultStatus::Success, "files:echo", "call-1"));
    assert_eq!(echo.structured_content, Some(json!({"text": "hello", "length": 5})));
    let add = answered(&clients, &py, "add", json!({"a": 2, "b": 40})).await;
    assert_eq!((&add.content, &add.structured_content), (&Some(json!("42")), &Some(json!({"result": 42}))));
    // The answer matches the outputSchema the listing gave.
    let listed = clients.list_tools(&py, DiscoveryBudget::default()).await.unwrap();
    let add_tool = listed.iter().find(|t| t.name == "add").unwrap();
    assert!(checked_output(add_tool, add).is_success());
    let product = answered(&clients, &ts, "multiply", json!({"a": 6, "b": 7})).await;
    assert_eq!(product.structured_content, Some(json!({"product": 42})));

    // `isError` is failed, never a success: MCP_TOOL_ERROR unless the answer gives a safe error.
    let fail = answered(&clients, &py, "fail", json!({})).await;
    assert_eq!((fail.status, fail.error.unwrap().code.as_str()), (ResultStatus::Failed, MCP_TOOL_ERROR));
    let explode = answered(&clients, &ts, "explode", json!({})).await;
    assert_eq!(explode.status, ResultStatus::Failed);
    assert_eq!(explode.error.unwrap().code, MCP_TOOL_ERROR);
    let given = answered(&clients, &ts, "fail", json!({"id": "7"})).await;
    let error = given.error.unwrap();
    assert_eq!((given.status, error.code.as_str(), error.message.as_str()), (ResultStatus::Failed, "NOT_FOUND", "No such order"));
    // A tool the server does not have is a failed answer too (a JSON-RPC error).
    let unknown = answered(&clients, &py, "no_such_tool", json!({})).await;
    assert_eq!(unknown.status, ResultStatus::Failed);
}

#[tokio::test]
async fn a_late_call_times_out_and_the_session_goes_on() {
    let server = McpTestServer::python("tools", &[]).await;
    let clients = McpClients::new();
    let t = target(&server);
    let answer = clients.call_tool(&t, "slow", args(json!({"seconds": 30})), "c1", Duration::from_millis(800)).await;
    assert_eq!(answer, CallAnswer::TimedOut);
    assert_eq!(answer.into_result("c1", "files", "slow").status, ResultStatus::Timeout);
    let echo = answered(&clients, &t, "echo", json!({"text": "after"})).await;
    assert!(echo.is_success());
    assert_eq!(server.count("initialize").await, 1);
}

#[tokio::test]
async fn a_dropped_connection_is_unknown_and_a_gone_server_unsent() {
    let mut server = McpTestServer::python("tools", &[]).await;
    let clients = McpClients::new();
    let t = target(&server);
    assert!(answered(&clients, &t, "echo", json!({"text": "before"})).await.is_success());
    let answer = clients.call_tool(&t, "drop", Map::new(), "c1", CALL_TIMEOUT).await;
    assert!(matches!(answer, CallAnswer::Unknown(_)), "{answer:?}");
    assert_eq!(answer.clone().into_result("c1", "files", "drop").status, ResultStatus::Unknown);
    assert_eq!(server.exited(Duration::from_secs(10)).await, Some(3));
    // The server is gone: the next call is never sent, and says so.
    let next = clients.call_tool(&t, "echo", args(json!({"text": "x"})), "c2", CALL_TIMEOUT).await;
    let CallAnswer::Unsent(e) = next else { panic!("not unsent: {next:?}") };
    assert!(matches!(e, McpError::Connect { .. }), "{e}");
}

#[tokio::test]
async fn a_url_that_is_no_mcp_server_is_named_as_such() {
    let html = axum::Router::new().fallback(|| async { axum::response::Html("<html><body>Welcome</body></html>") });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let site = tokio::spawn(async move { axum::serve(listener, html).await });
    let clients = McpClients::new();
    let page = McpServerTarget::new("site", format!("http://{addr}/mcp"));
    let e = clients.list_tools(&page, DiscoveryBudget::default()).await.unwrap_err();
    assert!(matches!(e, McpError::NotMcp { .. }), "{e}");
    assert!(e.to_string().contains("does not answer as an MCP server"), "{e}");
    let answer = clients.call_tool(&page, "t", Map::new(), "c", CALL_TIMEOUT).await;
    assert!(matches!(answer, CallAnswer::Unsent(McpError::NotMcp { .. })), "{answer:?}");
    site.abort();

    // A closed port: nothing to connect to.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let gone = McpServerTarget::new("gone", format!("http://{closed}/mcp"));
    let e = clients.list_tools(&gone, DiscoveryBudget::default()).await.unwrap_err();
    assert!(matches!(e, McpError::Connect { .. }), "{e}");
    let e = clients.list_tools(&McpServerTarget::new("odd", "ftp://127.0.0.1/x"), DiscoveryBudget::default()).await.unwrap_err();
    assert!(e.unsent(), "{e}");
}

#[tokio::test]
async fn a_bearer_token_is_sent_and_never_shown() {
    let server = McpTestServer::python("tools", &["--token", "tok-abc-123456"]).await;
    let clients = McpClients::new();
    let wrong = target(&server).header("Authorization", "Bearer wrong-token-987654");
    let e = clients.list_tools(&wrong, DiscoveryBudget::default()).await.unwrap_err();
    assert!(matches!(e, McpError::Unauthorized { .. }), "{e}");
    assert!(!format!("{e} {e:?} {wrong:?}").contains("wrong-token-987654"), "{e}");
    let answer = clients.call_tool(&wrong, "echo", args(json!({"text": "x"})), "c", CALL_TIMEOUT).await;
    assert!(matches!(answer, CallAnswer::Unsent(McpError::Unauthorized { .. })), "{answer:?}");
    let right = target(&server).header("Authorization", "Bearer tok-abc-123456");
    assert!(answered(&clients, &right, "echo", json!({"text": "in"})).await.is_success());
}

#[tokio::test]
async fn a_session_is_reused_across_calls_and_listings() {
    let py = McpTestServer::python("tools", &[]).await;
    let ts = McpTestServer::typescript().await;
    let clients = McpClients::new();
    for server in [&py, &ts] {
        let t = target(server);
        clients.list_tools(&t, DiscoveryBudget::default()).await.unwrap();
        let tool = if server.url == py.url { ("echo", json!({"text": "a"})) } else { ("multiply", json!({"a": 1, "b": 2})) };
        for _ in 0..3 {
            assert!(answered(&clients, &t, tool.0, tool.1.clone()).await.is_success());
        }
        assert_eq!(server.count("initialize").await, 1, "{}", server.url);
        assert_eq!(server.count("tools/call").await, 3);
    }
    // Concurrent first calls share one handshake.
    let fresh = McpClients::new();
    let t = target(&py);
    let calls = (0..4).map(|_| fresh.call_tool(&t, "echo", args(json!({"text": "c"})), "c", CALL_TIMEOUT));
    for answer in futures::future::join_all(calls).await {
        assert!(matches!(answer, CallAnswer::Answered(ref r) if r.is_success()), "{answer:?}");
    }
    assert_eq!(py.count("initialize").await, 2);
}
