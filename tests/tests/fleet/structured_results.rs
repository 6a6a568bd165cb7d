//! Seed 002's structured results taken from a tool owner's answer: a `failed` status is a failure
//! (bare or inside `result`), `structuredContent` is kept, a timeout ends as `timeout`, an error
//! body's credentials never reach the record, and the model reads each as its observation.

use std::time::Duration;

use serde_json::{json, Value};

use fleet_tests::console::ConsoleClient;
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
use fleet_tests::{spawn_fleet, wait_for, Fleet, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_structured_results_1";

/// Waits until the execution is in a final state and returns it.
async fn wait_final(fleet: &Fleet, id: &str) -> Value {
    wait_for(&format!("{id} to finish"), Duration::from_secs(30), || async {
        let (code, body) = fleet.get(&format!("/v1/executions/{id}")).await;
        let status = body["data"]["status"].as_str().unwrap_or_default().to_string();
        (code == 200 && ["succeeded", "dead_lettered", "failed"].contains(&status.as_str()))
            .then(|| body["data"].clone())
    })
    .await
}

fn json_reply(status: u16, body: Value) -> Reply {
    Reply { status, body: body.to_string(), delay: Duration::ZERO, headers: vec![] }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_status_is_a_failure_bare_or_inside_result() {
    let failed = json!({"status": "failed", "error": {"code": "NOT_FOUND", "message": "No such order"}});
    let bare = failed.clone();
    let receiver = Receiver::start(SECRET, move |r, _| match r.path.as_str() {
        "/bare" => json_reply(200, bare.clone()),
        _ => json_reply(200, json!({"result": bare.clone()})),
    })
    .await;
    let admin = "console-admin-structured-01";
    let mut fleet =
        spawn_fleet(FleetOptions::default().env("FLEET_RETRY_DELAYS", "0.1,0.1").env("FLEET_API_TOKENS", admin)).await;
    fleet.token = admin.to_string();
    fleet.register_tool("bare", &receiver.url("/bare"), SECRET).await;
    fleet.register_tool("wrapped", &receiver.url("/wrapped"), SECRET).await;
    for tool in ["bare", "wrapped"] {
        let id = fleet.call_tool(tool, json!({"query": "o-1"})).await;
        let done = wait_final(&fleet, &id).await;
        assert_eq!(done["status"], "failed", "{tool}: a tool's failed result is not a success: {done}");
        let result = &done["external_result"];
        assert_eq!(result["status"], "failed", "{tool}: {done}");
        assert_eq!(result["error"], json!({"code": "NOT_FOUND", "message": "No such order"}), "{tool}");
        assert_eq!(result["callId"], id.as_str());
        assert_eq!(result["source"], tool);
        assert_eq!(receiver.received_for(&id).len(), 1, "{tool}: a tool's own failure is not retried");
        // The console shows it too.
        let console = ConsoleClient::login(&fleet.api, admin, false).await.client.expect("a console session");
        let (status, page) = console.get(&format!("/console/executions/{id}")).await;
        assert_eq!(status, 200);
        assert!(page.contains(r#"<span id="external-status">failed</span>"#) && page.contains("NOT_FOUND"), "{page}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_body_keeps_no_credentials() {
    let leak = "invalid request: api_key='sk-live-4f9a8b7c6d5e4f3a' rejected; token=abc123def456 Bearer eyJhbGciOi.x.y";
    let receiver = Receiver::start(SECRET, move |_, _| json_reply(400, json!({"error": leak}))).await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_RETRY_DELAYS", "0.1,0.1")).await;
    fleet.register_tool("leaky", &receiver.url("/leaky"), SECRET).await;
    let id = fleet.call_tool("leaky", json!({"query": "x"})).await;
    let done = wait_final(&fleet, &id).await;
    let shown = done.to_string();
    for secret in ["sk-live-4f9a8b7c6d5e4f3a", "abc123def456", "eyJhbGciOi.x.y"] {
        assert!(!shown.contains(secret), "{secret} is kept: {shown}");
    }
    let last_error = done["last_error"].as_str().unwrap_or_default();
    assert!(last_error.contains("HTTP 400") && last_error.contains("invalid request"), "{last_error}");
    let (_, dead) = fleet.get("/v1/dead-letters").await;
    assert!(!dead.to_string().contains("sk-live"), "{dead}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_always_times_out_ends_as_timeout() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::result(json!("late")).after(Duration::from_secs(3))).await;
    let options =
        FleetOptions::default().env("FLEET_RETRY_DELAYS", "0.1,0.1").env("FLEET_CALLBACK_TIMEOUT", "0.3");
    let fleet = spawn_fleet(options).await;
    fleet.register_tool("slow", &receiver.url("/slow"), SECRET).await;
    let id = fleet.call_tool("slow", json!({"query": "x"})).await;
    let done = wait_final(&fleet, &id).await;
    assert_eq!(done["status"], "dead_lettered", "kept for replay: {done}");
    assert_eq!(done["external_result"]["status"], "timeout", "{done}");
    assert_eq!(done["external_result"]["error"]["code"], "TIMEOUT", "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_content_in_a_bare_answer_is_kept() {
    let answer = json!({"content": [{"type": "text", "text": "21 C in Paris"}], "structuredContent": {"celsius": 21}});
    let shown = answer.clone();
    let receiver = Receiver::start(SECRET, move |_, _| json_reply(200, shown.clone())).await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("weather", &receiver.url("/weather"), SECRET).await;
    let id = fleet.call_tool("weather", json!({"query": "Paris"})).await;
    let done = wait_final(&fleet, &id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["external_result"]["status"], "success");
    assert_eq!(done["external_result"]["structuredContent"], json!({"celsius": 21}), "{done}");
    assert_eq!(done["external_result"]["content"], answer["content"]);
    assert_eq!(done["result"], json!({"celsius": 21}), "the seed's result is the structured content");
}

/// A model's calls: one answered `failed`, one with structured content, one that times out; the
/// model reads each as seed 002's observation, and none is promoted to a success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_reads_each_result_as_its_observation() {
    let llm = MockLlm::start(|body, _| {
        if body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool") {
            LlmReply::text("noted")
        } else {
            LlmReply::ToolCalls(vec![
                ("call_failed".into(), "orders".into(), r#"{"query":"o"}"#.into()),
                ("call_weather".into(), "weather".into(), r#"{"query":"w"}"#.into()),
                ("call_slow".into(), "slow".into(), r#"{"query":"s"}"#.into()),
            ])
        }
    })
    .await;
    let receiver = Receiver::start(SECRET, |r, _| match r.path.as_str() {
        "/orders" => json_reply(200, json!({"status": "failed", "error": {"code": "NOT_FOUND", "message": "No such order"}})),
        "/weather" => json_reply(200, json!({"content": "21 C", "structuredContent": {"celsius": 21}})),
        _ => Reply::result(json!("late")).after(Duration::from_secs(3)),
    })
    .await;
    let options = llm_fleet(&llm).env("FLEET_RETRY_DELAYS", "0.1").env("FLEET_CALLBACK_TIMEOUT", "0.3");
    let fleet = spawn_fleet(options).await;
    for tool in ["orders", "weather", "slow"] {
        fleet.register_tool(tool, &receiver.url(&format!("/{tool}")), SECRET).await;
    }
    let id = post_turn(&fleet, &turn_body("s_observations", "go", &["orders", "weather", "slow"])).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "the model was called again with the three results");
    let tool_messages: Vec<Value> = requests[1].messages().into_iter().filter(|m| m["role"] == "tool").collect();
    let content = |call: &str| {
        let message = tool_messages.iter().find(|m| m["tool_call_id"] == call).expect(call);
        message["content"].as_str().unwrap_or_default().to_string()
    };
    assert_eq!(content("call_failed"), "failed: error NOT_FOUND: No such order");
    let weather: Value = serde_json::from_str(&content("call_weather")).expect("parts");
    assert_eq!(weather, json!([{"type": "text", "text": "21 C"}, {"type": "json", "data": {"celsius": 21}}]));
    assert!(content("call_slow").starts_with("timeout: error TIMEOUT: "), "{}", content("call_slow"));
}

/// Seed 001's path: a webhook registered before an agent's turn starts gets that turn's message,
/// even when a worker looked up the event's subscribers (and found none) a moment before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_registered_before_an_agents_turn_gets_its_message() {
    let llm = MockLlm::start(|_, _| LlmReply::text("hello")).await;
    let hooks = Receiver::start(SECRET, |_, _| Reply::status(200)).await;
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_REGISTRY_CACHE", "60")).await;
    let (status, agent) = fleet.post("/v1/agents/assistants", &json!({"name": "helper", "title": "Helper", "instructions": "Help."})).await;
    assert_eq!(status, 201, "{agent}");
    let agent = agent["data"]["id"].as_str().unwrap().to_string();
    let first = fleet_tests::turn::send_agent_input(&fleet, &agent, "s_hook_before", "hi").await;
    fleet.wait_status(&first, "succeeded", Duration::from_secs(20)).await;

    let hook = json!({"url": hooks.url("/chat"), "secret": SECRET, "events": ["agent.room.message"]});
    let (status, _) = fleet.request(reqwest::Method::PUT, "/v1/webhooks/chat", Some(&hook)).await;
    assert_eq!(status, 201);
    let second = fleet_tests::turn::send_agent_input(&fleet, &agent, "s_hook_after", "hi again").await;
    fleet.wait_status(&second, "succeeded", Duration::from_secs(20)).await;
    wait_for("the agent turn's message delivered", Duration::from_secs(20), || async {
        hooks.received().into_iter().find(|r| r.json["data"]["execution_id"] == second.as_str())
    })
    .await;
}
