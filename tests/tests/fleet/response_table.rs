//! The seed's response table taken exactly (non-JSON 200s, relative status URLs, broker-held 202
//! polls), proxy variables that must not route callbacks around the SSRF guard, and the hygiene of
//! every stored error and of tool results handed to the model.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::proxy::Proxy;
use fleet_tests::{spawn_fleet, wait_for, Fleet, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_response_table_0123";

/// Waits until the execution is in a final state and returns it.
async fn wait_final(fleet: &Fleet, id: &str, timeout: Duration) -> Value {
    wait_for(&format!("{id} to finish"), timeout, || async {
        let (code, body) = fleet.get(&format!("/v1/executions/{id}")).await;
        let status = body["data"]["status"].as_str().unwrap_or_default().to_string();
        (code == 200 && ["succeeded", "dead_lettered", "failed"].contains(&status.as_str()))
            .then(|| body["data"].clone())
    })
    .await
}

fn reply(status: u16, body: &str) -> Reply {
    Reply { status, body: body.to_string(), delay: Duration::ZERO, headers: vec![] }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_whose_body_is_not_json_is_a_success() {
    let receiver = Receiver::start(SECRET, |_, _| reply(200, "OK").header("content-type", "text/plain")).await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_RETRY_DELAYS", "0.1,0.1")).await;
    fleet.register_tool("plain", &receiver.url("/plain"), SECRET).await;
    let id = fleet.call_tool("plain", json!({"query": "x"})).await;
    let done = wait_final(&fleet, &id, Duration::from_secs(20)).await;
    assert_eq!(done["status"], "succeeded", "a 200 text/plain is a success: {done}");
    assert_eq!(done["result"], serde_json::Value::Null, "only the seed's {{\"result\": …}} is a result");
    assert_eq!(receiver.received().len(), 1, "called once, not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_status_url_or_location_is_resolved_against_the_callback_url() {
    let receiver = Receiver::start(SECRET, |r, _| match r.path.as_str() {
        // Absolute-path reference in the body: resolves to the callback's origin.
        "/tools/by_body" => reply(202, &json!({"status_url": format!("/jobs/{}", r.execution_id())}).to_string()),
        // Relative-path reference in Location: resolves against the callback's directory.
        "/tools/by_location" => Reply::status(202).header("location", &format!("status/{}", r.execution_id())),
        p if p.starts_with("/jobs/") => Reply::result(json!({"polled": "body"})),
        p if p.starts_with("/tools/status/") => Reply::result(json!({"polled": "location"})),
        _ => Reply::status(404),
    })
    .await;
    let fleet = spawn_fleet(
        FleetOptions::default().env("FLEET_RETRY_DELAYS", "0.1,0.1").env("FLEET_ASYNC_POLL_INTERVAL", "0.1"),
    )
    .await;
    fleet.register_tool("by_body", &receiver.url("/tools/by_body"), SECRET).await;
    fleet.register_tool("by_location", &receiver.url("/tools/by_location"), SECRET).await;
    let by_body = fleet.call_tool("by_body", json!({"query": "x"})).await;
    let by_location = fleet.call_tool("by_location", json!({"query": "x"})).await;
    for (id, expected) in [(&by_body, "body"), (&by_location, "location")] {
        let done = wait_final(&fleet, id, Duration::from_secs(20)).await;
        assert_eq!(done["status"], "succeeded", "{expected}: {done}");
        assert_eq!(done["result"], json!({"polled": expected}));
    }
    let polled: Vec<String> = receiver.received().iter().map(|r| r.path.clone()).collect();
    assert!(polled.contains(&format!("/jobs/{by_body}")), "{polled:?}");
    assert!(polled.contains(&format!("/tools/status/{by_location}")), "{polled:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polled_202_does_not_hold_a_worker_slot() {
    // The slow tool's status (on a receiver of its own) stays pending until the test says it is ready.
    let ready = Arc::new(AtomicBool::new(false));
    let status = Receiver::start(SECRET, {
        let ready = ready.clone();
        move |_, _| {
            if ready.load(Ordering::SeqCst) {
                Reply::result(json!({"slow": "done"}))
            } else {
                reply(202, r#"{"status":"pending"}"#)
            }
        }
    })
    .await;
    let receiver = Receiver::start(SECRET, {
        let status_addr = status.addr;
        move |r, _| match r.path.as_str() {
            "/slow" => reply(
                202,
                &json!({"status_url": format!("http://{status_addr}/status/{}", r.execution_id())}).to_string(),
            ),
            _ => Reply::result(json!({"fast": true})),
        }
    })
    .await;
    let fleet = spawn_fleet(
        FleetOptions::default()
            .env("FLEET_WORKER_CONCURRENCY", "1")
            .env("FLEET_RETRY_DELAYS", "0.2,0.4")
            .env("FLEET_ASYNC_POLL_INTERVAL", "0.2")
            .env("FLEET_ASYNC_POLL_LIMIT", "60"),
    )
    .await;
    fleet.register_tool("slow", &receiver.url("/slow"), SECRET).await;
    fleet.register_tool("fast", &receiver.url("/fast"), SECRET).await;
    let slow = fleet.call_tool("slow", json!({"query": "x"})).await;
    wait_for("the slow tool's status to be polled", Duration::from_secs(20), || async {
        (!status.received().is_empty()).then_some(())
    })
    .await;
    let fast = fleet.call_tool("fast", json!({"query": "y"})).await;
    // Generous, but far below the 60 s poll limit that a sleeping poll would hold the slot for.
    fleet.wait_status(&fast, "succeeded", Duration::from_secs(15)).await;
    let (_, view) = fleet.get(&format!("/v1/executions/{slow}")).await;
    assert_ne!(view["data"]["status"], "succeeded", "the slow tool was still pending");

    ready.store(true, Ordering::SeqCst);
    let done = fleet.wait_status(&slow, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(done["result"], json!({"slow": "done"}));
    let attempts = done["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "polling spends no attempt: {attempts:?}");
    assert_eq!(receiver.received().iter().filter(|r| r.path == "/slow").count(), 1, "POSTed once");
    let poll = &status.received()[0];
    assert_eq!(poll.header("x-interactor-request-id"), Some(slow.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_environment_variables_do_not_route_callbacks_around_the_ssrf_guard() {
    let receiver = Receiver::echo(SECRET).await;
    // A counting forwarder standing in for an HTTP proxy: every connection it accepts is one the
    // worker routed through it.
    let proxy = Proxy::start(receiver.addr).await;
    let proxy_url = format!("http://{}", proxy.addr);
    let mut options = FleetOptions::default().env("NO_PROXY", "").env("no_proxy", "");
    for var in ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"] {
        options = options.env(var, &proxy_url);
    }
    let fleet = spawn_fleet(options).await;
    fleet.register_tool("direct", &receiver.url("/direct"), SECRET).await;
    let id = fleet.call_tool("direct", json!({"query": "x"})).await;
    let done = wait_final(&fleet, &id, Duration::from_secs(20)).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(proxy.accepted(), 0, "the callback went through the proxy");
    assert_eq!(receiver.received().len(), 1);
}

/// The rules every stored or emitted error obeys.
fn assert_clean(what: &str, error: &str) {
    assert!(error.chars().count() <= 512, "{what}: {} chars", error.chars().count());
    assert!(!error.chars().any(char::is_control), "{what} has control characters: {error:?}");
    for leak in ["hunter2", "admin:", "token=", "abc123", "at com.example", "Foo.java", "\u{1b}", "sk-live-51HxQ2", "pa55w0rd-x"]
    {
        assert!(!error.contains(leak), "{what} contains {leak:?}: {error:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_errors_are_one_short_line_without_credentials_or_query_strings() {
    let body = format!(
        "rejected api_key='sk-live-51HxQ2' password: \"pa55w0rd-x\" upstream https://admin:hunter2@internal.example/api?token=abc123 failed\r\n\u{1b}[31mjava.lang.IllegalStateException: boom\u{7}\n\tat com.example.Foo.bar(Foo.java:42)\n\tat com.example.Main.main(Main.java:7)\n{}",
        "padding ".repeat(200)
    );
    let receiver = Receiver::start(SECRET, move |_, _| reply(500, &body)).await;
    let hooks = Receiver::start(SECRET, |_, _| Reply::status(200)).await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_RETRY_DELAYS", "0.1,0.1")).await;
    let (status, _) = fleet
        .request(
            reqwest::Method::PUT,
            "/v1/webhooks/failures",
            Some(&json!({"url": hooks.url("/events"), "secret": SECRET, "events": ["tool.callback.failed", "tool.callback.dead_letter"]})),
        )
        .await;
    assert_eq!(status, 201);
    fleet.register_tool("leaky", &receiver.url("/leaky"), SECRET).await;
    let id = fleet.call_tool("leaky", json!({"query": "x"})).await;
    let done = fleet.wait_status(&id, "dead_lettered", Duration::from_secs(30)).await;

    let attempts = done["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3);
    for a in attempts {
        let error = a["error"].as_str().unwrap();
        assert!(error.contains("500"), "the error still says what happened: {error}");
        assert_clean("attempt error", error);
    }
    assert_clean("last_error", done["last_error"].as_str().unwrap());
    let (status, record) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
    assert_eq!(status, 200, "{record}");
    assert_clean("dead-letter last_error", record["data"]["last_error"].as_str().unwrap());
    for a in record["data"]["history"].as_array().unwrap() {
        assert_clean("dead-letter history", a["error"].as_str().unwrap());
    }
    let events = wait_for("both failure webhooks", Duration::from_secs(15), || async {
        let got: Vec<_> =
            hooks.received().into_iter().filter(|r| r.json["data"]["execution_id"] == id.as_str()).collect();
        (got.len() >= 2).then_some(got)
    })
    .await;
    for e in events {
        assert_clean("webhook last_error", e.json["data"]["last_error"].as_str().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_result_over_the_limit_reaches_the_model_cut_at_a_utf8_boundary() {
    let llm = MockLlm::start(|body, _| {
        let tool_messages = body["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "tool").count();
        if tool_messages == 0 {
            LlmReply::ToolCalls(vec![("call_big".into(), "big".into(), r#"{"query":"all"}"#.into())])
        } else {
            LlmReply::text("Summarised.")
        }
    })
    .await;
    // 3 000 two-byte characters: 6 000 bytes, cut somewhere inside one of them at 1 001 bytes.
    let big = "é".repeat(3000);
    let tool = Receiver::start(SECRET, {
        let big = big.clone();
        move |_, _| Reply::result(json!({"text": big}))
    })
    .await;
    let fleet = spawn_fleet(
        FleetOptions::default()
            .env("FLEET_LLM_BASE_URL", &llm.base_url())
            .env("FLEET_LLM_API_KEY", "sk-test-key")
            .env("FLEET_TOOL_RESULT_MAX_BYTES", "1001"),
    )
    .await;
    fleet.register_tool("big", &tool.url("/big"), SECRET).await;
    let body = json!({
        "session_id": "s_big",
        "assistant": {"id": "asst_1", "instructions": "You are helpful.", "model_config": {"provider": "openai", "model": "test-model", "temperature": 0.2}, "enabled_tools": ["big"]},
        "messages": [{"role": "user", "content": "read it all"}]
    });
    let (status, resp) = fleet.post("/v1/turns", &body).await;
    assert_eq!(status, 202, "{resp}");
    let turn = resp["data"]["execution_id"].as_str().unwrap().to_string();
    fleet.wait_status(&turn, "succeeded", Duration::from_secs(30)).await;

    let second = &llm.requests()[1];
    let message = second.messages().into_iter().find(|m| m["role"] == "tool").unwrap();
    let content = message["content"].as_str().unwrap();
    let seen: Value = serde_json::from_str(content).unwrap_or(Value::Null);
    assert_eq!(
        seen["truncated"],
        true,
        "the model is told the result was cut: {}",
        content.chars().take(80).collect::<String>()
    );
    let cut = seen["content"].as_str().unwrap();
    let full = json!({"text": big}).to_string();
    assert!(cut.len() <= 1001 && cut.len() >= 990, "cut to the limit: {} bytes", cut.len());
    assert!(full.starts_with(cut), "a prefix of the full result");

    // The tool call's own record keeps the whole result.
    let (_, view) = fleet.get(&format!("/v1/executions/{turn}")).await;
    let call_id = view["data"]["turn"]["tool_calls"][0]["execution_id"].as_str().expect("the call's execution id");
    let (_, call) = fleet.get(&format!("/v1/executions/{call_id}")).await;
    assert_eq!(call["data"]["result"]["text"].as_str().map(str::len), Some(6000));
}
