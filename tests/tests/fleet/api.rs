//! The dispatcher's HTTP contract: auth on every route, the tool registry (secrets encrypted and
//! never returned), bad input answered with the documented 4xx and nothing published, and 503
//! when the broker is down.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use fleet_tests::proxy::Proxy;
use fleet_tests::{redis_url, spawn_fleet, wait_for, FleetOptions};

const SECRET: &str = "whsec_api_test_secret_42";

fn v1_routes() -> Vec<(Method, &'static str)> {
    vec![
        (Method::GET, "/v1/tools"),
        (Method::POST, "/v1/tools"),
        (Method::PUT, "/v1/tools/x"),
        (Method::GET, "/v1/tools/x"),
        (Method::DELETE, "/v1/tools/x"),
        (Method::POST, "/v1/tool-calls"),
        (Method::GET, "/v1/executions/exec_1"),
        (Method::GET, "/v1/dead-letters"),
        (Method::GET, "/v1/dead-letters/exec_1"),
        (Method::DELETE, "/v1/dead-letters/exec_1"),
        (Method::POST, "/v1/dead-letters/exec_1/retry"),
        (Method::POST, "/v1/dead-letters/retry"),
        (Method::POST, "/v1/dead-letters/purge"),
        (Method::GET, "/v1/webhooks"),
        (Method::PUT, "/v1/webhooks/w"),
        (Method::GET, "/v1/webhooks/w"),
        (Method::DELETE, "/v1/webhooks/w"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_v1_route_refuses_a_missing_or_wrong_token() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    for (method, path) in v1_routes() {
        for auth in
            [None, Some("Bearer wrong-token-0123456789"), Some("Basic Zm9vOmJhcg=="), Some(fleet.token.as_str())]
        {
            let mut req = fleet.http.request(method.clone(), format!("{}{path}", fleet.api)).json(&json!({}));
            if let Some(a) = auth {
                req = req.header("Authorization", a);
            }
            // The last case is the right token without "Bearer ": a malformed header, also refused.
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            assert_eq!(status, 401, "{method} {path} with {auth:?}");
            let body: Value = resp.json().await.unwrap();
            assert_eq!(body["error"]["code"], "unauthorized");
            assert!(!body.to_string().contains("wrong-token"), "the token is not echoed");
        }
    }
    let (status, _) = fleet.get("/v1/tools").await;
    assert_eq!(status, 200, "the right token passes");
    let health = fleet.http.get(format!("{}/healthz", fleet.api)).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200, "health needs no token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_registry_keeps_secrets_encrypted_and_never_returns_them() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    fleet.register_tool("search_products", "https://tools.example.com/search", SECRET).await;
    let (status, got) = fleet.get("/v1/tools/search_products").await;
    assert_eq!(status, 200);
    assert_eq!(got["data"]["name"], "search_products");
    assert!(fleet_protocol::tools::is_tool_id(got["data"]["id"].as_str().unwrap()), "{got}");
    assert_eq!(got["data"]["callback_url"], "https://tools.example.com/search");
    assert!(got["data"].get("callback_secret").is_none());
    assert!(!got.to_string().contains(SECRET));

    // A partial PUT updates in place and keeps the secret.
    let (status, updated) = fleet
        .request(Method::PUT, "/v1/tools/search_products", Some(&json!({"description": "Updated description"})))
        .await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(updated["data"]["description"], "Updated description");
    assert_eq!(updated["data"]["callback_url"], "https://tools.example.com/search");

    let (_, list) = fleet.get("/v1/tools").await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
    assert!(list["next_cursor"].is_null());
    assert!(!list.to_string().contains(SECRET));

    // At rest the secret is ciphertext.
    let client = redis::Client::open(redis_url()).unwrap();
    let mut con = fleet_tests::redis_connection(&client).await;
    let stored: String = redis::cmd("GET")
        .arg(fleet_protocol::keys::Keys::new(&fleet.key_prefix).tool("search_products"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(!stored.contains(SECRET), "stored tool holds the plaintext secret");
    assert!(stored.contains("\"secret_ciphertext\":\"v1."));

    let (status, _) = fleet.request(Method::DELETE, "/v1/tools/search_products", None).await;
    assert_eq!(status, 204);
    let (status, body) = fleet.get("/v1/tools/search_products").await;
    assert_eq!(status, 404);
    assert!(body["error"]["message"].as_str().unwrap().contains("search_products"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_named_4xx_and_nothing_is_published() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0).env("FLEET_MAX_BODY_BYTES", "65536")).await;
    fleet.register_tool("echo", "https://tools.example.com/echo", SECRET).await;
    let raw = |body: Vec<u8>| {
        fleet
            .http
            .post(format!("{}/v1/tool-calls", fleet.api))
            .bearer_auth(&fleet.token)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    let check = |status: u16, body: &Value, expected: u16, needle: &str| {
        assert_eq!(status, expected, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_else(|| panic!("JSON error body: {body}"));
        assert!(message.contains(needle), "{message:?} should name {needle:?}");
        assert!(body["error"]["code"].is_string());
    };
    let answer = |r: reqwest::Response| async move {
        let s = r.status().as_u16();
        (s, r.json::<Value>().await.unwrap())
    };

    let (s, b) = answer(raw(b"{\"tool_name\": ".to_vec()).await.unwrap()).await;
    check(s, &b, 400, "not valid JSON");
    let (s, b) = answer(raw(vec![b'x'; 70_000]).await.unwrap()).await;
    check(s, &b, 413, "size limit");
    let (s, b) = fleet.post("/v1/tool-calls", &json!({"tool_name": "nope", "parameters": {}})).await;
    check(s, &b, 422, "nope");
    assert_eq!(b["error"]["code"], "unknown_tool");
    let (s, b) = fleet.post("/v1/tool-calls", &json!({"tool_name": "echo", "parameters": "a string"})).await;
    check(s, &b, 422, "parameters");
    let (s, b) = fleet.post("/v1/tool-calls", &json!({"parameters": {}})).await;
    check(s, &b, 422, "tool_name");
    let (s, b) = fleet.post("/v1/tool-calls", &json!({"tool_name": "echo", "parameters": {}, "colour": "red"})).await;
    check(s, &b, 422, "colour");
    let (s, b) =
        fleet.post("/v1/tool-calls", &json!({"tool_name": "echo", "parameters": {}, "room_id": "x".repeat(300)})).await;
    check(s, &b, 422, "room_id");
    let (s, b) = fleet.request(Method::PUT, "/v1/tools/bad%20name", Some(&json!({}))).await;
    check(s, &b, 422, "tool name");
    let (s, b) = fleet
        .request(Method::PUT, "/v1/tools/t", Some(&json!({"callback_url": "ftp://x/y", "callback_secret": SECRET})))
        .await;
    check(s, &b, 422, "callback_url");
    let (s, b) = fleet.request(Method::PUT, "/v1/tools/t", Some(&json!({"callback_url": "https://a.example/x"}))).await;
    check(s, &b, 422, "callback_secret");
    let (s, b) = fleet.get("/v1/executions/exec_doesnotexist").await;
    check(s, &b, 404, "exec_doesnotexist");

    assert_eq!(fleet.waiting_depth(fleet_protocol::envelope::JobKind::ToolCall).await, 0, "nothing was published");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_callback_targets_are_refused_unless_allowed() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0).env("FLEET_ALLOW_PRIVATE_CALLBACKS", "false")).await;
    for url in [
        "http://127.0.0.1:8080/x",
        "http://localhost/x",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/x",
        "http://10.1.2.3/",
    ] {
        let (status, body) = fleet
            .request(Method::PUT, "/v1/tools/t", Some(&json!({"callback_url": url, "callback_secret": SECRET})))
            .await;
        assert_eq!(status, 422, "{url}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("not allowed"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_at_enqueue_answers_503_and_accepts_nothing() {
    let proxy = Proxy::start("127.0.0.1:5672".parse().unwrap()).await;
    let options = FleetOptions {
        workers: 0,
        dispatcher_amqp_url: Some(format!("amqp://guest:guest@{}/%2f", proxy.addr)),
        ..Default::default()
    };
    let fleet = spawn_fleet(options).await;
    fleet.register_tool("echo", "https://tools.example.com/echo", SECRET).await;
    proxy.cut();
    let ready = format!("{}/readyz", fleet.api);
    wait_for("readiness to report the outage", Duration::from_secs(10), || async {
        let r = fleet.http.get(&ready).send().await.ok()?;
        (r.status().as_u16() == 503).then_some(())
    })
    .await;
    let (status, body) =
        fleet.post("/v1/tool-calls", &json!({"tool_name": "echo", "parameters": {"query": "x"}})).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "broker_unavailable");
    assert!(body.get("data").is_none(), "nothing claims success");
    assert_eq!(fleet.waiting_depth(fleet_protocol::envelope::JobKind::ToolCall).await, 0);

    // The dispatcher reconnects by itself once the broker is reachable again.
    proxy.restore();
    wait_for("readiness after the outage", Duration::from_secs(20), || async {
        let r = fleet.http.get(&ready).send().await.ok()?;
        r.status().is_success().then_some(())
    })
    .await;
    let (status, body) =
        fleet.post("/v1/tool-calls", &json!({"tool_name": "echo", "parameters": {"query": "x"}})).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(fleet.waiting_depth(fleet_protocol::envelope::JobKind::ToolCall).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_exposed_with_fleet_names() {
    let fleet = spawn_fleet(FleetOptions::default().workers(1)).await;
    let _ = fleet.get("/v1/tools").await;
    let text = fleet.http.get(format!("{}/metrics", fleet.api)).send().await.unwrap().text().await.unwrap();
    assert!(text.contains("fleet_http_requests_total{class=\"2xx\",method=\"GET\",route=\"/v1/tools\"}"), "{text}");
    assert!(text.contains("fleet_broker_connected 1"));
    let worker = fleet.worker_metrics(0).await;
    assert!(worker.contains("fleet_build_info{process=\"worker\""));
}

#[test]
fn a_bad_or_missing_setting_stops_the_process_with_one_line_naming_it() {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    for (bin, env, setting) in [
        ("dispatcher", vec![("FLEET_API_TOKENS", "token-0123456789abcdef")], "FLEET_SECRETS_KEY"),
        ("dispatcher", vec![("FLEET_SECRETS_KEY", fleet_tests::fleet::TEST_SECRETS_KEY)], "FLEET_API_TOKENS"),
        (
            "worker",
            vec![("FLEET_SECRETS_KEY", fleet_tests::fleet::TEST_SECRETS_KEY), ("FLEET_WORKER_CONCURRENCY", "lots")],
            "FLEET_WORKER_CONCURRENCY",
        ),
        ("worker", vec![("FLEET_SECRETS_KEY", "too-short")], "FLEET_SECRETS_KEY"),
    ] {
        let out = std::process::Command::new(dir.join(bin))
            .env_clear()
            .envs(env)
            .env("FLEET_HTTP_ADDR", "127.0.0.1:1")
            .env("FLEET_WORKER_HTTP_ADDR", "127.0.0.1:1")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bin} exits with a configuration error");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(setting), "{bin}: {stderr:?} names {setting}");
    }
}

/// A tool call within the body limit but too large to travel as a job with its retries' headroom
/// is refused before anything is recorded or published (413 naming the envelope limit), alone or
/// in a batch; one a little smaller is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_too_large_to_travel_as_a_job_is_refused_before_it_is_recorded() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    let receiver = fleet_tests::Receiver::start(SECRET, |_, _| fleet_tests::Reply::result(json!("ok"))).await;
    let tool = json!({"description": "d", "parameters": {"type": "object"}, "callback_url": receiver.url("/big"),
        "callback_secret": SECRET});
    let (status, body) = fleet.request(Method::PUT, "/v1/tools/big", Some(&tool)).await;
    assert_eq!(status, 201, "{body}");
    let call = |size: usize| json!({"tool_name": "big", "parameters": {"blob": "x".repeat(size)}});
    let limit = fleet_protocol::envelope::MAX_ENVELOPE_BYTES;
    // Under the 1 MiB body limit, over what a job may carry with its 16 KiB headroom.
    let (status, body) = fleet.post("/v1/tool-calls", &call(limit - 8 * 1024)).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "job_too_large", "{body}");
    let (status, body) = fleet.post("/v1/tool-calls/batch", &json!({"calls": [call(limit - 8 * 1024)]})).await;
    assert_eq!(status, 413, "{body}");
    assert!(fleet.redis_keys("*exec_*").await.is_empty(), "nothing recorded");
    assert_eq!(fleet.waiting_depth(fleet_protocol::envelope::JobKind::ToolCall).await, 0, "nothing published");
    let (status, body) = fleet.post("/v1/tool-calls", &call(limit - 64 * 1024)).await;
    assert_eq!(status, 202, "a call that fits is accepted: {body}");
}
