//! The callback pipeline end to end: dispatcher → RabbitMQ → workers → signed callbacks, with the
//! broker-held retry schedule, idempotency and dead letters. Real processes, RabbitMQ and Redis.

use std::time::Duration;

use lapin::BasicProperties;
use serde_json::{json, Value};

use fleet_protocol::envelope::{Envelope, Job, ToolCallJob};
use fleet_tests::schedule::{self, check_waits};
use fleet_tests::{metric, spawn_fleet, wait_for, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_test_secret_0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_are_signed_exactly_as_the_seed() {
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("search_products", &receiver.url("/api/tools/search_products"), SECRET).await;
    let id = fleet.call_tool("search_products", json!({"query": "laptop", "max_results": 5})).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(done["result"], json!({"echo": {"query": "laptop", "max_results": 5}}));

    let got = receiver.received_for(&id);
    assert_eq!(got.len(), 1);
    let r = &got[0];
    assert_eq!(r.path, "/api/tools/search_products");
    r.verified.as_ref().expect("independent HMAC and 300 s window verify");
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-interactor-request-id"), Some(id.as_str()));
    assert!(r.header("x-interactor-signature").unwrap().starts_with("sha256="));
    let tp = r.header("traceparent").expect("traceparent header");
    let parts: Vec<&str> = tp.split('-').collect();
    assert!(
        parts.len() == 4 && parts[0] == "00" && parts[1].len() == 32 && parts[2].len() == 16,
        "W3C traceparent: {tp}"
    );
    // The body is the seed's, field for field, and its timestamp is the signing time.
    let body = r.json.as_object().unwrap();
    let mut fields: Vec<&str> = body.keys().map(String::as_str).collect();
    fields.sort();
    assert_eq!(fields, ["assistant_id", "execution_id", "parameters", "room_id", "timestamp", "tool_name"]);
    assert_eq!(body["tool_name"], "search_products");
    assert_eq!(body["room_id"], "room_1");
    assert_eq!(body["assistant_id"], "asst_1");
    assert_eq!(body["timestamp"].as_str(), r.header("x-interactor-timestamp"));
    // A tampered body does not verify with the same signature.
    let mut tampered = r.body.clone();
    tampered[5] ^= 1;
    let expected =
        format!("sha256={}", hex::encode(fleet_tests::independent_hmac_sha256(SECRET.as_bytes(), &tampered)));
    assert_ne!(Some(expected.as_str()), r.header("x-interactor-signature"));
    // Attempt history records the answer.
    let attempts = done["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["http_status"], 200);
    assert_eq!(attempts[0]["outcome"], "success");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_calls_succeed_and_are_readable() {
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default().workers(2)).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.push(fleet.call_tool("echo", json!({"query": format!("q{n}")})).await);
    }
    for (n, id) in ids.iter().enumerate() {
        let done = fleet.wait_status(id, "succeeded", Duration::from_secs(30)).await;
        assert_eq!(done["result"]["echo"]["query"], format!("q{n}"));
        assert_eq!(done["tool_name"], "echo");
        assert_eq!(receiver.side_effects(id), 1);
    }
    assert_eq!(receiver.received().len(), 20, "one request per call");
    assert!(receiver.received().iter().all(|r| r.verified.is_ok()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failures_retry_on_the_default_schedule() {
    let receiver = Receiver::start(SECRET, |_, n| match n {
        0 => Reply::status(500),
        1 => Reply::status(503),
        _ => Reply::result(json!("third time lucky")),
    })
    .await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("flaky", &receiver.url("/flaky"), SECRET).await;
    let id = fleet.call_tool("flaky", json!({"query": "x"})).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(done["result"], "third time lucky");
    let attempts = done["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3);
    assert_eq!(attempts[0]["http_status"], 500);
    assert_eq!(attempts[1]["http_status"], 503);
    assert_eq!(attempts[2]["outcome"], "success");
    let got = receiver.received_for(&id);
    assert_eq!(got.len(), 3);
    // Waits of 1 s then 2 s, held by the broker; each wait checked on its own (see `schedule`).
    let at: Vec<_> = got.iter().map(|r| r.at).collect();
    check_waits(&schedule::gaps(&at), &[1.0, 2.0]).unwrap();
    // Every attempt is signed afresh: same execution id, new timestamp.
    assert!(got.iter().all(|r| r.verified.is_ok() && r.header("x-interactor-request-id") == Some(id.as_str())));
    assert_ne!(got[0].header("x-interactor-timestamp"), got[2].header("x-interactor-timestamp"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_failing_callbacks_use_all_six_attempts_then_dead_letter() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(500)).await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("broken", &receiver.url("/broken"), SECRET).await;
    let tap = fleet.dead_letter_tap().await;
    let id = fleet.call_tool("broken", json!({"query": "x"})).await;
    let done = fleet.wait_status(&id, "dead_lettered", Duration::from_secs(50)).await;
    let got = receiver.received_for(&id);
    assert_eq!(got.len(), 6, "exactly six attempts");
    // The seed's schedule: waits of 1, 2, 4, 8, 16 s, each checked on its own, so the lateness of
    // one hop does not count against the next.
    let at: Vec<_> = got.iter().map(|r| r.at).collect();
    check_waits(&schedule::gaps(&at), &[1.0, 2.0, 4.0, 8.0, 16.0]).unwrap();
    assert_eq!(done["attempts"].as_array().unwrap().len(), 6);
    assert_eq!(done["attempts"][5]["outcome"], "exhausted");

    let (status, dl) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
    assert_eq!(status, 200, "{dl}");
    let record = &dl["data"];
    assert_eq!(record["execution_id"], id.as_str());
    assert_eq!(record["tool_name"], "broken");
    assert_eq!(record["assistant_id"], "asst_1");
    assert_eq!(record["room_id"], "room_1");
    assert_eq!(record["attempts"], 6);
    assert_eq!(record["reason"], "exhausted");
    assert!(record["last_error"].as_str().unwrap().contains("HTTP 500"));
    assert!(record["first_attempt_at"].is_string() && record["last_attempt_at"].is_string());
    assert_eq!(record["history"].as_array().unwrap().len(), 6);
    assert!(!record.to_string().contains(SECRET), "no secret in a dead letter");

    // An operator's tap on the dead-letter exchange got the record too.
    let queued = tap.next().await.expect("a message on the tap");
    assert_eq!(queued["execution_id"], id.as_str());
    assert_eq!(queued["job"]["tool_name"], "broken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_dead_letters_after_one_attempt() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(404)).await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("gone", &receiver.url("/gone"), SECRET).await;
    let id = fleet.call_tool("gone", json!({"query": "x"})).await;
    let done = fleet.wait_status(&id, "dead_lettered", Duration::from_secs(20)).await;
    assert_eq!(done["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(done["attempts"][0]["outcome"], "permanent");
    let (status, dl) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(dl["data"]["reason"], "permanent");
    assert_eq!(dl["data"]["attempts"], 1);
    assert_eq!(receiver.received_for(&id).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_published_twice_runs_once() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::result(json!("done")).after(Duration::from_millis(300))).await;
    let fleet = spawn_fleet(FleetOptions::default().workers(2).env("FLEET_CLAIM_LEASE", "1")).await;
    fleet.register_tool("once", &receiver.url("/once"), SECRET).await;
    let id = fleet_protocol::new_execution_id();
    let envelope = Envelope::new(
        id.clone(),
        Job::ToolCall(ToolCallJob {
            tool_name: "once".into(),
            parameters: json!({"query": "dup"}),
            room_id: None,
            assistant_id: None,
            parent: None,
        }),
        fleet_platform_now(),
    );
    let props = || {
        BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_message_id(id.as_str().into())
    };
    fleet.publish_raw(&envelope.to_bytes(), props()).await;
    fleet.publish_raw(&envelope.to_bytes(), props()).await;
    // Both deliveries are settled: one ran, the other was recognised as a duplicate.
    wait_for("the duplicate to be recognised", Duration::from_secs(20), || async {
        let mut hits = 0.0;
        for w in 0..2 {
            hits += metric(&fleet.worker_metrics(w).await, "fleet_idempotency_hits_total{kind=\"tool_call\"}");
        }
        (hits >= 1.0).then_some(())
    })
    .await;
    assert_eq!(receiver.received_for(&id).len(), 1, "the tool was called once");
    assert_eq!(receiver.side_effects(&id), 1);
    let view = fleet.wait_status(&id, "succeeded", Duration::from_secs(5)).await;
    assert_eq!(view["attempts"].as_array().unwrap().len(), 1, "the result was stored once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_callback_loses_nothing_and_doubles_nothing() {
    // The first request hangs long enough for the test to SIGKILL the worker holding it.
    let receiver = Receiver::start(SECRET, |_, n| {
        if n == 0 {
            Reply::result(json!("never seen")).after(Duration::from_secs(20))
        } else {
            Reply::result(json!("second worker"))
        }
    })
    .await;
    let mut fleet = spawn_fleet(FleetOptions::default().env("FLEET_CLAIM_LEASE", "1.5")).await;
    fleet.register_tool("slow", &receiver.url("/slow"), SECRET).await;
    let id = fleet.call_tool("slow", json!({"query": "x"})).await;
    wait_for("the first callback to arrive", Duration::from_secs(10), || async {
        (!receiver.received_for(&id).is_empty()).then_some(())
    })
    .await;
    fleet.kill_worker(0);
    fleet.spawn_worker().await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["result"], "second worker");
    assert_eq!(receiver.side_effects(&id), 1, "side effect recorded once for the execution id");
    let got = receiver.received_for(&id);
    assert_eq!(got.len(), 2, "the killed worker's call plus the new worker's, same execution id");
    assert!(got.iter().all(|r| r.header("x-interactor-request-id") == Some(id.as_str())));
    let successes = done["attempts"].as_array().unwrap().iter().filter(|a| a["outcome"] == "success").count();
    assert_eq!(successes, 1, "the result was stored once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_are_dead_lettered_and_the_worker_keeps_working() {
    let receiver = Receiver::echo(SECRET).await;
    let mut fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    fleet
        .publish_raw(
            b"\x00\xffnot json at all",
            BasicProperties::default().with_content_type("application/json".into()),
        )
        .await;
    fleet.publish_raw(br#"{"v":1}"#, BasicProperties::default().with_content_type("text/plain".into())).await;
    fleet
        .publish_raw(
            br#"{"v":9,"execution_id":"exec_future","attempt":1,"enqueued_at_ms":1,"kind":"tool_call","tool_name":"echo","parameters":{}}"#,
            BasicProperties::default().with_content_type("application/json".into()).with_message_id("exec_future".into()),
        )
        .await;
    let listed = wait_for("three poison dead letters", Duration::from_secs(20), || async {
        let (status, listed) = fleet.get("/v1/dead-letters").await;
        (status == 200 && listed["data"].as_array().is_some_and(|d| d.len() >= 3)).then_some(listed)
    })
    .await;
    let records = listed["data"].as_array().unwrap();
    assert_eq!(records.len(), 3);
    assert!(records.iter().all(|r| r["reason"] == "poison"));
    let errors: Vec<&str> = records.iter().map(|r| r["last_error"].as_str().unwrap()).collect();
    assert!(errors.iter().any(|e| e.contains("not JSON")), "{errors:?}");
    assert!(errors.iter().any(|e| e.contains("content type")), "{errors:?}");
    assert!(errors.iter().any(|e| e.contains("version")), "{errors:?}");
    let (_, future) = fleet.get("/v1/dead-letters/exec_future").await;
    assert_eq!(future["data"]["reason"], "poison");
    // The same worker process goes on serving jobs.
    assert!(fleet.worker_alive(0));
    let id = fleet.call_tool("echo", json!({"query": "after poison"})).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    assert!(fleet.worker_alive(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_returns_the_same_execution() {
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let send = || async {
        let resp = fleet
            .http
            .post(format!("{}/v1/tool-calls", fleet.api))
            .bearer_auth(&fleet.token)
            .header("Idempotency-Key", "order-42")
            .json(&json!({"tool_name": "echo", "parameters": {"query": "once"}}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 202);
        let body: Value = resp.json().await.unwrap();
        body["data"]["execution_id"].as_str().unwrap().to_string()
    };
    let first = send().await;
    let second = send().await;
    assert_eq!(first, second);
    fleet.wait_status(&first, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(send().await, first, "still the same after it ran");
    assert_eq!(receiver.received().len(), 1, "one job for one key");
}

fn fleet_platform_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}
