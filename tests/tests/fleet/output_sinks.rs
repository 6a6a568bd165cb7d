//! Seed 002's output sinks: a turn's final message delivered to the webhook its assistant names
//! as `{deliveryId, message}`, settled by the sink's `OutputReceipt`: `accepted` is the
//! delivery's result, `unknown` is tried again under the same `deliveryId`, a rejection or a
//! receipt for another delivery is never a success.

use std::time::Duration;

use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, post_turn, send_agent_input, turn_body};
use fleet_tests::{spawn_fleet, wait_for, Fleet, Receiver, Reply};

const SECRET: &str = "whsec_output_sinks_secret_1";

fn receipt(status: &str, delivery_id: &str, error: Option<Value>) -> Reply {
    let mut body = json!({"deliveryId": delivery_id, "status": status});
    if let Some(error) = error {
        body["error"] = error;
    }
    Reply { status: 200, body: body.to_string(), delay: Duration::ZERO, headers: vec![] }
}

async fn register_sink(fleet: &Fleet, id: &str, url: &str) {
    let hook = json!({"url": url, "secret": SECRET, "events": ["output.delivery"]});
    let (status, body) = fleet.request(reqwest::Method::PUT, &format!("/v1/webhooks/{id}"), Some(&hook)).await;
    assert_eq!(status, 201, "{body}");
}

fn with_sink(mut body: Value, sink: &str) -> Value {
    body["assistant"]["output_sink"] = json!(sink);
    body
}

/// The delivery's record once final.
async fn delivery(fleet: &Fleet, delivery_id: &str) -> Value {
    wait_for(&format!("delivery {delivery_id} to end"), Duration::from_secs(30), || async {
        let (_, body) = fleet.get(&format!("/v1/executions/{delivery_id}")).await;
        let status = body["data"]["status"].as_str().unwrap_or_default().to_string();
        ["succeeded", "dead_lettered", "failed"].contains(&status.as_str()).then(|| body["data"].clone())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_final_message_reaches_its_sink_and_the_receipt_is_kept() {
    let llm = MockLlm::start(|_, _| LlmReply::text("Report ready.")).await;
    let sink = Receiver::start(SECRET, |r, _| receipt("accepted", r.json["deliveryId"].as_str().unwrap(), None)).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    register_sink(&fleet, "reports", &sink.url("/deliveries")).await;
    let id = post_turn(&fleet, &with_sink(turn_body("s_sink", "write the report", &[]), "reports")).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    let got = wait_for("the delivery", Duration::from_secs(20), || async { sink.received().into_iter().next() }).await;
    assert!(got.verified.is_ok(), "signed with the sink's secret");
    assert_eq!(got.json["message"], json!({"role": "assistant", "content": "Report ready."}));
    let delivery_id = got.json["deliveryId"].as_str().unwrap().to_string();
    assert_eq!(got.execution_id(), delivery_id, "the delivery id is its execution id");
    let record = delivery(&fleet, &delivery_id).await;
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["result"], json!({"deliveryId": delivery_id, "status": "accepted"}));
    assert_eq!(sink.received().len(), 1, "delivered once");

    // A stored agent names its sink the same way (seed 001's path).
    let agent = json!({"name": "reporter", "title": "Reporter", "instructions": "Report.", "output_sink": "reports"});
    let (status, created) = fleet.post("/v1/agents/assistants", &agent).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["data"]["output_sink"], "reports");
    let agent_id = created["data"]["id"].as_str().unwrap().to_string();
    let turn = send_agent_input(&fleet, &agent_id, "s_agent_sink", "go").await;
    fleet.wait_status(&turn, "succeeded", Duration::from_secs(20)).await;
    wait_for("the agent turn's delivery", Duration::from_secs(20), || async {
        (sink.received().len() == 2).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_receipt_is_tried_again_under_the_same_delivery_id() {
    let llm = MockLlm::start(|_, _| LlmReply::text("Done.")).await;
    let sink = Receiver::start(SECRET, |r, n| {
        let id = r.json["deliveryId"].as_str().unwrap();
        receipt(if n == 0 { "unknown" } else { "accepted" }, id, None)
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    register_sink(&fleet, "flaky", &sink.url("/d")).await;
    let id = post_turn(&fleet, &with_sink(turn_body("s_unknown", "go", &[]), "flaky")).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    let ids = wait_for("two deliveries", Duration::from_secs(20), || async {
        let got = sink.received();
        (got.len() == 2).then(|| got.iter().map(|r| r.json["deliveryId"].clone()).collect::<Vec<_>>())
    })
    .await;
    assert_eq!(ids[0], ids[1], "the retry carries the same deliveryId");
    let record = delivery(&fleet, ids[0].as_str().unwrap()).await;
    assert_eq!(record["status"], "succeeded", "{record}");
    assert!(record["attempts"][0]["error"].as_str().unwrap().contains("unknown"), "{record}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_or_mismatched_receipt_is_never_a_success() {
    let llm = MockLlm::start(|_, _| LlmReply::text("Done.")).await;
    let sink = Receiver::start(SECRET, |r, _| match r.path.as_str() {
        "/reject" => receipt(
            "rejected",
            r.json["deliveryId"].as_str().unwrap(),
            Some(json!({"code": "DELIVERY_REJECTED", "message": "The destination rejected the result"})),
        ),
        _ => receipt("accepted", "some-other-delivery", None),
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_RETRY_DELAYS", "0.1,0.1")).await;
    register_sink(&fleet, "reject", &sink.url("/reject")).await;
    register_sink(&fleet, "mismatch", &sink.url("/mismatch")).await;
    for (sink_id, why) in [("reject", "DELIVERY_REJECTED"), ("mismatch", "some-other-delivery")] {
        let id = post_turn(&fleet, &with_sink(turn_body(&format!("s_{sink_id}"), "go", &[]), sink_id)).await;
        fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
        let path = format!("/{sink_id}");
        let got = wait_for("the delivery", Duration::from_secs(20), || async {
            sink.received().into_iter().find(|r| r.path == path)
        })
        .await;
        let record = delivery(&fleet, got.json["deliveryId"].as_str().unwrap()).await;
        assert_eq!(record["status"], "dead_lettered", "{sink_id}: never accepted: {record}");
        let error = record["last_error"].as_str().unwrap_or_default();
        assert!(error.contains(why), "{sink_id}: {error}");
        assert_eq!(sink.received().iter().filter(|r| r.path == path).count(), 1, "{sink_id}: not retried");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_is_not_a_registered_output_webhook_is_refused() {
    let llm = MockLlm::start(|_, _| LlmReply::text("Done.")).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let (status, body) = fleet.post("/v1/turns", &with_sink(turn_body("s_nosink", "go", &[]), "nowhere")).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "unknown_output_sink");
    let hook = json!({"url": "http://127.0.0.1:9/h", "secret": SECRET, "events": ["agent.room.message"]});
    let (status, _) = fleet.request(reqwest::Method::PUT, "/v1/webhooks/chat", Some(&hook)).await;
    assert_eq!(status, 201);
    let (status, body) = fleet.post("/v1/turns", &with_sink(turn_body("s_nosink", "go", &[]), "chat")).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("output.delivery"), "{body}");
    let agent = json!({"name": "r", "title": "R", "instructions": "R.", "output_sink": "nowhere"});
    let (status, body) = fleet.post("/v1/agents/assistants", &agent).await;
    assert_eq!(status, 422, "{body}");
}
