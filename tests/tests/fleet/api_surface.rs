//! The dispatcher's client surface: token scopes on every route (a token lacking exactly a
//! route's scope gets 403 naming it, one holding it gets through), the OpenAPI document served
//! without a token, and every error in the API's JSON shape.

use reqwest::Method;
use serde_json::{json, Value};

use fleet_tests::{spawn_fleet, FleetOptions};

/// Every authenticated route, the scope it needs, and a body that gets past parsing.
fn scoped_routes() -> Vec<(Method, &'static str, &'static str, Option<Value>)> {
    let tool =
        json!({"name": "scoped_tool", "callback_url": "http://127.0.0.1:9/x", "callback_secret": "0123456789abcdef"});
    vec![
        (Method::GET, "/v1/tools", "tools:read", None),
        (Method::POST, "/v1/tools", "tools:write", Some(tool.clone())),
        (Method::PUT, "/v1/tools/scoped_tool", "tools:write", Some(tool)),
        (Method::GET, "/v1/tools/scoped_tool", "tools:read", None),
        (Method::DELETE, "/v1/tools/nope", "tools:write", None),
        (Method::POST, "/v1/tools/nope/circuit/close", "tools:write", None),
        (Method::POST, "/v1/tool-calls", "calls:write", Some(json!({"tool_name": "nope", "parameters": {}}))),
        (
            Method::POST,
            "/v1/tool-calls/batch",
            "calls:write",
            Some(json!({"calls": [{"tool_name": "nope", "parameters": {}}]})),
        ),
        (Method::POST, "/v1/turns", "turns:write", Some(json!({"session_id": "s"}))),
        (Method::GET, "/v1/sessions/s1/stream", "sessions:read", None),
        (Method::POST, "/v1/sessions/s1/stream-token", "sessions:read", None),
        (Method::GET, "/v1/sessions/s1/messages", "sessions:read", None),
        (Method::DELETE, "/v1/sessions/s1", "sessions:write", None),
        (Method::GET, "/v1/executions", "executions:read", None),
        (Method::GET, "/v1/executions/exec_1", "executions:read", None),
        (Method::POST, "/v1/executions/exec_1/cancel", "executions:write", None),
        (Method::GET, "/v1/dead-letters", "dead_letters:read", None),
        (Method::GET, "/v1/dead-letters/exec_1", "dead_letters:read", None),
        (Method::DELETE, "/v1/dead-letters/exec_1", "dead_letters:admin", None),
        (Method::POST, "/v1/dead-letters/exec_1/retry", "dead_letters:admin", None),
        (Method::POST, "/v1/dead-letters/retry", "dead_letters:admin", Some(json!({"execution_ids": ["none"]}))),
        (Method::POST, "/v1/dead-letters/purge", "dead_letters:admin", Some(json!({"execution_ids": ["none"]}))),
        (Method::GET, "/v1/webhooks", "webhooks:read", None),
        (Method::PUT, "/v1/webhooks/w1", "webhooks:write", Some(json!({"url": "http://127.0.0.1:9/h"}))),
        (Method::GET, "/v1/webhooks/w1", "webhooks:read", None),
        (Method::DELETE, "/v1/webhooks/w1", "webhooks:write", None),
        (Method::GET, "/v1/agents/assistants", "assistants:read", None),
        (Method::POST, "/v1/agents/assistants", "assistants:write", Some(json!({"name": "x"}))),
        (Method::GET, "/v1/agents/assistants/asst_1", "assistants:read", None),
        (Method::PUT, "/v1/agents/assistants/asst_1", "assistants:write", Some(json!({"title": "T"}))),
        (Method::DELETE, "/v1/agents/assistants/asst_1", "assistants:write", None),
        (Method::POST, "/v1/agents/asst_1/rooms", "sessions:write", Some(json!({}))),
        (Method::GET, "/v1/agents/rooms", "sessions:read", None),
        (Method::GET, "/v1/agents/rooms/room_1", "sessions:read", None),
        (Method::POST, "/v1/agents/rooms/room_1/close", "sessions:write", None),
        (Method::POST, "/v1/agents/rooms/room_1/messages", "turns:write", Some(json!({"content": "hi"}))),
        (Method::GET, "/v1/agents/rooms/room_1/messages", "sessions:read", None),
        (Method::GET, "/v1/agents/rooms/room_1/stream", "sessions:read", None),
        (Method::POST, "/v1/agents/rooms/room_1/stream-token", "sessions:read", None),
        (Method::GET, "/v1/usage", "usage:read", None),
    ]
}

const SCOPES: [&str; 15] = [
    "tools:read",
    "tools:write",
    "calls:write",
    "turns:write",
    "sessions:read",
    "sessions:write",
    "executions:read",
    "executions:write",
    "dead_letters:read",
    "dead_letters:admin",
    "webhooks:read",
    "webhooks:write",
    "assistants:read",
    "assistants:write",
    "usage:read",
];

/// How many operations of docs/openapi.json need one of `scopes` (the seed 001 route aside, which
/// the seed 001 tests walk).
fn documented_with(scopes: &[&str]) -> usize {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json")).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let mut count = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for op in item.as_object().unwrap().values() {
            let needs = op["security"][0]["bearer"].as_array().and_then(|names| names[0].as_str()).unwrap_or_default();
            count += usize::from(scopes.contains(&needs) && !path.starts_with("/v2/"));
        }
    }
    count
}

fn without(scope: &str) -> String {
    format!("without-{}-0123456789", scope.replace(':', "-"))
}
fn only(scope: &str) -> String {
    format!("only-{}-0123456789", scope.replace(':', "-"))
}

async fn send(
    fleet: &fleet_tests::Fleet,
    token: &str,
    method: &Method,
    path: &str,
    body: &Option<Value>,
) -> (u16, Value) {
    let mut req = fleet.http.request(method.clone(), format!("{}{path}", fleet.api)).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(b);
    }
    let resp = req.send().await.expect("dispatcher reachable");
    let status = resp.status().as_u16();
    // A stream's body never ends: only its status matters here.
    if resp.headers().get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream")) {
        return (status, Value::Null);
    }
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_a_token_lacking_its_scope_and_admits_one_holding_it() {
    let mut tokens: Vec<String> = vec!["full-rights-token-0123456789".into()];
    for scope in SCOPES {
        let others: Vec<&str> = SCOPES.into_iter().filter(|s| *s != scope).collect();
        tokens.push(format!("{}:{}", without(scope), others.join("+")));
        tokens.push(format!("{}:{scope}", only(scope)));
    }
    let fleet = spawn_fleet(FleetOptions::default().workers(0).env("FLEET_API_TOKENS", &tokens.join(","))).await;
    let routes = scoped_routes();
    assert_eq!(routes.len(), documented_with(&SCOPES), "every operation of docs/openapi.json needing one of SCOPES");
    for (method, path, scope, body) in &routes {
        let (status, error) = send(&fleet, &without(scope), method, path, body).await;
        assert_eq!(status, 403, "{method} {path} without {scope}: {error}");
        assert_eq!(error["error"]["code"], "insufficient_scope", "{method} {path}: {error}");
        assert_eq!(error["error"]["required_scope"], *scope, "{method} {path}: {error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(scope), "{method} {path}: the message names the scope: {message}");

        let (status, answer) = send(&fleet, &only(scope), method, path, body).await;
        assert!(status != 403 && status != 401, "{method} {path} with only {scope}: {status} {answer}");
        let (status, answer) = send(&fleet, "full-rights-token-0123456789", method, path, body).await;
        assert!(status != 403 && status != 401, "{method} {path} with a plain token: {status} {answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_served_without_a_token_and_is_the_checked_in_one() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    let resp = fleet.http.get(format!("{}/v1/openapi.json", fleet.api)).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let served = resp.text().await.unwrap();
    let checked_in = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json")).unwrap();
    assert_eq!(served, checked_in, "the served document is docs/openapi.json");
    let doc: Value = serde_json::from_str(&served).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_string_of_the_wrong_type_gets_the_json_error_shape() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    for path in ["/v1/tools?limit=null", "/v1/webhooks?limit=x", "/v1/dead-letters?reason=nope"] {
        let resp = fleet.http.get(format!("{}{path}", fleet.api)).bearer_auth(&fleet.token).send().await.unwrap();
        let status = resp.status().as_u16();
        let content_type = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
        let body = resp.text().await.unwrap();
        assert!((400..500).contains(&status), "{path}: {status}");
        assert_eq!(content_type.as_deref(), Some("application/json"), "{path}: {status} {body}");
        let error: Value = serde_json::from_str(&body).unwrap();
        assert!(
            error["error"]["message"].as_str().is_some_and(|m| m.contains("limit") || m.contains("reason")),
            "{body}"
        );
    }
}
