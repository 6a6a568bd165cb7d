//! The dispatcher's client surface: token scopes on every route (a token lacking exactly a
//! route's scope gets 403 naming it, one holding it gets through), the OpenAPI document served
//! without a token, and every error in the API's JSON shape.

use reqwest::Method;
use serde_json::{json, Value};

use fleet_tests::contract::Operation;
use fleet_tests::{spawn_fleet, FleetOptions};

/// Every operation of docs/openapi.json that needs one of `SCOPES`, read from the document (the
/// seed 001 route aside, which the seed 001 tests walk): its method, a path with each parameter
/// filled in, its scope, and a body (empty JSON) for one that takes one. A new route is walked as
/// soon as it is declared.
fn scoped_routes() -> Vec<(Method, String, String, Option<Value>)> {
    let mut routes = Vec::new();
    for Operation { method, path, op } in fleet_tests::contract::operations() {
        let scope = op["security"][0]["bearer"].as_array().and_then(|names| names[0].as_str()).unwrap_or_default();
        if !SCOPES.contains(&scope) || path.starts_with("/v2/") {
            continue;
        }
        let concrete: String = path
            .split('/')
            .map(|segment| if segment.starts_with('{') { "x1" } else { segment })
            .collect::<Vec<_>>()
            .join("/");
        let body = op.get("requestBody").map(|_| json!({}));
        routes.push((method, concrete, scope.to_string(), body));
    }
    routes
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
    for scope in SCOPES {
        assert!(routes.iter().any(|(_, _, s, _)| s == scope), "no operation of docs/openapi.json needs {scope}");
    }
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
    let checked_in = fleet_tests::contract::checked_in();
    assert_eq!(served, checked_in, "the served document is docs/openapi.json");
    let doc: Value = serde_json::from_str(&served).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_string_of_the_wrong_type_gets_the_json_error_shape() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    for path in [
        "/v1/tools?limit=null",
        "/v1/webhooks?limit=x",
        "/v1/dead-letters?reason=nope",
        "/v1/executions?kind=nope",
        "/v1/executions?kind=",
    ] {
        let resp = fleet.http.get(format!("{}{path}", fleet.api)).bearer_auth(&fleet.token).send().await.unwrap();
        let status = resp.status().as_u16();
        let content_type = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
        let body = resp.text().await.unwrap();
        assert!((400..500).contains(&status), "{path}: {status}");
        assert_eq!(content_type.as_deref(), Some("application/json"), "{path}: {status} {body}");
        let error: Value = serde_json::from_str(&body).unwrap();
        assert!(
            error["error"]["message"].as_str().is_some_and(|m| ["limit", "reason", "kind"].iter().any(|n| m.contains(n))),
            "{body}"
        );
    }
}
