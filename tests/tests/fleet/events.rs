//! Failure events: a tool call that fails for good sends `tool.callback.failed` and
//! `tool.callback.dead_letter` (the seed's payload) to subscribed webhooks, signed, on the webhook
//! retry path.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use fleet_tests::{spawn_fleet, wait_for, FleetOptions, Receiver, Reply};

const TOOL_SECRET: &str = "whsec_tool_secret_for_events";
const HOOK_SECRET: &str = "whsec_webhook_secret_events";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_calls_notify_subscribed_webhooks() {
    let tool = Receiver::start(TOOL_SECRET, |_, _| Reply::status(404)).await;
    // The webhook receiver fails its first delivery, so the event takes the retry path.
    let hooks = Receiver::start(HOOK_SECRET, |r, n| {
        if n == 0 && r.json["event"] == "tool.callback.dead_letter" {
            Reply::status(503)
        } else {
            Reply::status(200)
        }
    })
    .await;
    let bystander = Receiver::start(HOOK_SECRET, |_, _| Reply::status(200)).await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_RETRY_DELAYS", "0.2,0.4")).await;
    fleet.register_tool("lookup", &tool.url("/lookup"), TOOL_SECRET).await;
    let (status, body) = fleet
        .request(
            Method::PUT,
            "/v1/webhooks/ops",
            Some(&json!({"url": hooks.url("/events"), "secret": HOOK_SECRET, "events": ["tool.callback.failed", "tool.callback.dead_letter"]})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert!(!body.to_string().contains(HOOK_SECRET));
    let (status, _) = fleet
        .request(
            Method::PUT,
            "/v1/webhooks/chat",
            Some(&json!({"url": bystander.url("/chat"), "secret": HOOK_SECRET, "events": ["agent.room.message"]})),
        )
        .await;
    assert_eq!(status, 201);
    let (status, body) = fleet
        .request(
            Method::PUT,
            "/v1/webhooks/bad",
            Some(&json!({"url": hooks.url("/x"), "secret": HOOK_SECRET, "events": ["tool.*"]})),
        )
        .await;
    assert_eq!(status, 422);
    assert!(body["error"]["message"].as_str().unwrap().contains("tool.*"));

    let id = fleet.call_tool("lookup", json!({"query": "x"})).await;
    fleet.wait_status(&id, "dead_lettered", Duration::from_secs(20)).await;
    let events = wait_for("both failure events delivered", Duration::from_secs(20), || async {
        let got = hooks.received();
        let ok: Vec<_> = got.iter().filter(|r| r.verified.is_ok()).collect();
        let failed = ok.iter().any(|r| r.json["event"] == "tool.callback.failed");
        let dead = ok.iter().filter(|r| r.json["event"] == "tool.callback.dead_letter").count() >= 2;
        (failed && dead).then_some(got)
    })
    .await;
    let dead: Vec<_> = events.iter().filter(|r| r.json["event"] == "tool.callback.dead_letter").collect();
    assert_eq!(dead.len(), 2, "the 503 was retried once");
    let data = &dead[1].json["data"];
    assert_eq!(data["execution_id"], id.as_str());
    assert_eq!(data["tool_name"], "lookup");
    assert_eq!(data["assistant_id"], "asst_1");
    assert_eq!(data["room_id"], "room_1");
    assert_eq!(data["attempts"], 1);
    assert!(data["last_error"].as_str().unwrap().contains("404"));
    assert!(data["first_attempt_at"].is_string() && data["last_attempt_at"].is_string());
    let failed = events.iter().find(|r| r.json["event"] == "tool.callback.failed").unwrap();
    assert_eq!(failed.json["data"]["execution_id"], id.as_str());
    // Each delivery has its own execution id, the same on its retry; none of them is the call's.
    assert_eq!(dead[0].header("x-interactor-request-id"), dead[1].header("x-interactor-request-id"));
    assert_ne!(dead[0].header("x-interactor-request-id"), Some(id.as_str()));
    assert_ne!(failed.header("x-interactor-request-id"), dead[0].header("x-interactor-request-id"));
    let delivery_id = dead[1].header("x-interactor-request-id").unwrap().to_string();
    let delivery = fleet.wait_status(&delivery_id, "succeeded", Duration::from_secs(5)).await;
    assert_eq!(delivery["kind"], "webhook");
    assert_eq!(delivery["attempts"].as_array().unwrap().len(), 2);
    assert!(bystander.received().is_empty(), "only subscribers get the events");

    let (status, listed) = fleet.get("/v1/webhooks").await;
    assert_eq!(status, 200);
    assert_eq!(listed["data"].as_array().unwrap().len(), 2);
    let (status, _) = fleet.request(Method::DELETE, "/v1/webhooks/chat", None).await;
    assert_eq!(status, 204);
}

/// A webhook registered before a turn starts gets that turn's message, even when a worker looked
/// up the event's subscribers (and found none) a moment before: the lookup a worker keeps is not
/// older than the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_registered_just_before_a_turn_gets_its_message() {
    let llm = fleet_tests::llm::MockLlm::start(|_, _| fleet_tests::llm::LlmReply::text("hello")).await;
    let hooks = Receiver::start(HOOK_SECRET, |_, _| Reply::status(200)).await;
    // A long cache, so a stale lookup could not have expired on its own during the test.
    let fleet = spawn_fleet(fleet_tests::turn::llm_fleet(&llm).env("FLEET_REGISTRY_CACHE", "60")).await;
    let body = |session: &str| fleet_tests::turn::turn_body(session, "hi", &[]);
    let first = fleet_tests::turn::post_turn(&fleet, &body("s_before")).await;
    fleet.wait_status(&first, "succeeded", Duration::from_secs(20)).await;

    let hook = json!({"url": hooks.url("/chat"), "secret": HOOK_SECRET, "events": ["agent.room.message"]});
    let (status, _) = fleet.request(Method::PUT, "/v1/webhooks/chat", Some(&hook)).await;
    assert_eq!(status, 201);
    let second = fleet_tests::turn::post_turn(&fleet, &body("s_after")).await;
    fleet.wait_status(&second, "succeeded", Duration::from_secs(20)).await;
    let got = wait_for("the turn's message delivered", Duration::from_secs(20), || async {
        hooks.received().into_iter().find(|r| r.json["data"]["execution_id"] == second.as_str())
    })
    .await;
    assert!(got.verified.is_ok(), "signed with the webhook's secret");
    assert_eq!(got.json["event"], "agent.room.message");
    assert!(
        hooks.received().iter().all(|r| r.json["data"]["execution_id"] != first.as_str()),
        "the turn before the webhook is not delivered to it"
    );
}
