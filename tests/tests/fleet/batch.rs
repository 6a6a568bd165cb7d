//! Batch and scheduled enqueue: `POST /v1/tool-calls/batch` accepts 1,000 calls in one request and
//! each runs once; one bad call refuses the batch before anything is published; a retried batch
//! with its `Idempotency-Key` gets the same ids and publishes nothing twice; a call with
//! `delay_seconds` waits in the broker until due, one with a past `run_at` runs at once.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use fleet_protocol::envelope::JobKind;
use fleet_protocol::timefmt::{millis_from_rfc3339, rfc3339_from_millis};
use fleet_tests::proxy::Proxy;
use fleet_tests::{spawn_fleet, wait_for, Fleet, FleetOptions, Receiver};

const SECRET: &str = "whsec_batch_secret_0001";

/// `POST /v1/tool-calls/batch` (with an `Idempotency-Key` if given): status, body, and whether the
/// answer says it replays an earlier one.
async fn post_batch(fleet: &Fleet, key: Option<&str>, calls: &[Value]) -> (u16, Value, bool) {
    let mut req = fleet
        .http
        .post(format!("{}/v1/tool-calls/batch", fleet.api))
        .bearer_auth(&fleet.token)
        .json(&json!({"calls": calls}));
    if let Some(key) = key {
        req = req.header("Idempotency-Key", key);
    }
    let resp = req.send().await.expect("dispatcher reachable");
    let status = resp.status().as_u16();
    let replayed = resp.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
    (status, resp.json().await.unwrap_or(Value::Null), replayed)
}

fn call(query: &str) -> Value {
    json!({"tool_name": "echo", "parameters": {"query": query}})
}

fn ids_of(body: &Value) -> Vec<String> {
    body["data"]["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| c["execution_id"].as_str().unwrap().into())
        .collect()
}

/// Waits until the receiver has run `n` distinct executions' side effects.
async fn wait_side_effects(receiver: &Receiver, n: u32, timeout: Duration) {
    wait_for(&format!("{n} side effects"), timeout, || async { (receiver.total_side_effects() >= n).then_some(()) })
        .await;
}

/// Each of `ids` reached the receiver exactly once, and nothing else did.
fn assert_each_ran_once(receiver: &Receiver, ids: &[String]) {
    let received = receiver.received();
    let mut seen = HashSet::new();
    for r in &received {
        assert!(seen.insert(r.execution_id().to_string()), "{} reached the receiver twice", r.execution_id());
    }
    let expected: HashSet<String> = ids.iter().cloned().collect();
    assert_eq!(seen, expected, "the receiver saw exactly the batch's executions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_1000_is_accepted_in_one_request_and_each_call_runs_once() {
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default().workers(2)).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let calls: Vec<Value> = (0..1000).map(|i| call(&format!("q{i}"))).collect();

    let started = Instant::now();
    let (status, body, _) = post_batch(&fleet, None, &calls).await;
    let batch_time = started.elapsed();
    assert_eq!(status, 202, "{body}");
    assert_eq!((body["data"]["accepted"].as_u64(), body["data"]["failed"].as_u64()), (Some(1000), Some(0)));
    let ids = ids_of(&body);
    assert_eq!(ids.len(), 1000);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 1000, "distinct execution ids");
    assert!(body["data"]["calls"].as_array().unwrap().iter().all(|c| c["status"] == "queued"));

    wait_side_effects(&receiver, 1000, Duration::from_secs(180)).await;
    // In request order: call i carried query i.
    let last = receiver.received_for(&ids[999]);
    assert_eq!(last[0].json["parameters"]["query"], "q999");
    let done = fleet.wait_status(&ids[0], "succeeded", Duration::from_secs(10)).await;
    assert_eq!(done["attempts"].as_array().unwrap().len(), 1);
    // Each ran once: every worker has settled all it took, and nothing reached the receiver twice.
    wait_for("every delivery settled", Duration::from_secs(30), || async {
        let mut finished = 0.0;
        for w in 0..2 {
            let m = fleet.worker_metrics(w).await;
            finished += m
                .lines()
                .filter(|l| l.starts_with("fleet_jobs_finished_total{kind=\"tool_call\""))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
        }
        (finished >= 1000.0).then_some(())
    })
    .await;
    assert_each_ran_once(&receiver, &ids);

    // For comparison, in the same run: the same 1,000 calls as single POSTs, one after another.
    let started = Instant::now();
    for i in 0..1000 {
        let (status, body) = fleet.post("/v1/tool-calls", &call(&format!("single{i}"))).await;
        assert_eq!(status, 202, "{body}");
    }
    let singles_time = started.elapsed();
    println!(
        "batch of 1000: {:.0} ms; 1000 sequential POST /v1/tool-calls: {:.0} ms; ratio {:.1}x",
        batch_time.as_secs_f64() * 1000.0,
        singles_time.as_secs_f64() * 1000.0,
        singles_time.as_secs_f64() / batch_time.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_call_refuses_the_batch_naming_it_and_nothing_is_published() {
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;

    let mut calls: Vec<Value> = (0..20).map(|i| call(&format!("q{i}"))).collect();
    calls[17] = json!({"tool_name": "echo", "parameters": {"query": 17}});
    let (status, body, _) = post_batch(&fleet, None, &calls).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "invalid_parameters");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("calls[17].parameters: "), "{message}");

    calls[17] = json!({"tool_name": "echo", "parameters": {"query": "q"}, "run_at": "2026-01-01T00:00:00Z", "delay_seconds": 1});
    let (status, body, _) = post_batch(&fleet, None, &calls).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().starts_with("calls[17].run_at: "), "{body}");

    calls[17] = json!({"tool_name": "echo", "parameters": {"query": "q"}, "delay_seconds": 31 * 86_400});
    let (status, body, _) = post_batch(&fleet, None, &calls).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().starts_with("calls[17].delay_seconds: "), "{body}");

    calls[17] = json!({"tool_name": "nope", "parameters": {}});
    let (status, body, _) = post_batch(&fleet, None, &calls).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("unknown_tool")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().starts_with("calls[17].parameters: "), "{body}");

    calls[3] = json!({"tool_name": "echo", "parameters": {"query": "q"}, "colour": "red"});
    let (status, body, _) = post_batch(&fleet, None, &calls).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().starts_with("calls[3]"), "{body}");

    let (status, body, _) = post_batch(&fleet, None, &[]).await;
    assert_eq!(status, 422, "{body}");
    let too_many: Vec<Value> = (0..1001).map(|i| call(&format!("q{i}"))).collect();
    let (status, body, _) = post_batch(&fleet, None, &too_many).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().starts_with("calls: "), "{body}");

    // Nothing was published, and no execution was recorded.
    assert_eq!(fleet.waiting_depth(JobKind::ToolCall).await, 0);
    let client = redis::Client::open(fleet_tests::redis_url()).unwrap();
    let mut con = fleet_tests::redis_connection(&client).await;
    let records: Vec<String> =
        redis::cmd("KEYS").arg(format!("{}execution:*", fleet.key_prefix)).query_async(&mut con).await.unwrap();
    assert!(records.is_empty(), "no execution recorded: {records:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_batch_gets_the_same_ids_and_publishes_nothing_twice() {
    let receiver = Receiver::echo(SECRET).await;
    let mut fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let calls: Vec<Value> = (0..5).map(|i| call(&format!("q{i}"))).collect();

    let (status, first, replayed) = post_batch(&fleet, Some("batch-key-1"), &calls).await;
    assert_eq!((status, replayed), (202, false), "{first}");
    assert_eq!(fleet.waiting_depth(JobKind::ToolCall).await, 5);

    // The same batch again, key order and spacing aside: the same ids, nothing published again.
    let reordered: Vec<Value> =
        (0..5).map(|i| json!({"parameters": {"query": format!("q{i}")}, "tool_name": "echo"})).collect();
    let (status, again, replayed) = post_batch(&fleet, Some("batch-key-1"), &reordered).await;
    assert_eq!((status, replayed), (202, true), "{again}");
    assert_eq!(ids_of(&again), ids_of(&first));
    assert_eq!(fleet.waiting_depth(JobKind::ToolCall).await, 5, "nothing published twice");

    // The key with another batch is refused, and so is a batch's key on a single call.
    let (status, body, _) = post_batch(&fleet, Some("batch-key-1"), &calls[..4]).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("idempotency_key_reused")), "{body}");
    let single = fleet
        .http
        .post(format!("{}/v1/tool-calls", fleet.api))
        .bearer_auth(&fleet.token)
        .header("Idempotency-Key", "batch-key-1")
        .json(&calls[0])
        .send()
        .await
        .unwrap();
    assert_eq!(single.status().as_u16(), 422);
    assert_eq!(fleet.waiting_depth(JobKind::ToolCall).await, 5);

    fleet.spawn_worker().await;
    let ids = ids_of(&first);
    wait_side_effects(&receiver, 5, Duration::from_secs(60)).await;
    for id in &ids {
        fleet.wait_status(id, "succeeded", Duration::from_secs(10)).await;
    }
    let (status, after, replayed) = post_batch(&fleet, Some("batch-key-1"), &calls).await;
    assert_eq!((status, replayed), (202, true), "{after}");
    assert!(after["data"]["calls"].as_array().unwrap().iter().all(|c| c["status"] == "succeeded"), "{after}");
    assert_each_ran_once(&receiver, &ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_call_waits_in_the_broker_until_due_and_a_past_run_at_runs_now() {
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default().workers(1)).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;

    let sent = Instant::now();
    let before_ms = fleet_platform::now_ms();
    let (status, body) = fleet
        .post("/v1/tool-calls", &json!({"tool_name": "echo", "parameters": {"query": "later"}, "delay_seconds": 3}))
        .await;
    assert_eq!(status, 202, "{body}");
    let delayed = body["data"]["execution_id"].as_str().unwrap().to_string();
    let (_, record) = fleet.get(&format!("/v1/executions/{delayed}")).await;
    assert_eq!(record["data"]["status"], "queued", "{record}");
    let run_at = millis_from_rfc3339(record["data"]["run_at"].as_str().expect("run_at shown")).unwrap();
    assert!((run_at - before_ms - 3_000).abs() < 2_000, "run_at is about 3 s ahead: {record}");

    // A call whose run_at is past runs at once, in a batch, while the delayed one waits.
    let past = rfc3339_from_millis(before_ms - 60_000);
    let (status, body, _) =
        post_batch(&fleet, None, &[json!({"tool_name": "echo", "parameters": {"query": "now"}, "run_at": past})]).await;
    assert_eq!(status, 202, "{body}");
    let now_id = ids_of(&body).remove(0);
    let ran_now = wait_for("the past run_at call to run", Duration::from_secs(20), || async {
        receiver.received_for(&now_id).first().map(|r| r.at)
    })
    .await;
    assert!(receiver.received_for(&delayed).is_empty(), "the delayed call did not run early");

    let ran_later = wait_for("the delayed call to run", Duration::from_secs(30), || async {
        receiver.received_for(&delayed).first().map(|r| r.at)
    })
    .await;
    let waited = ran_later.duration_since(sent);
    println!(
        "delay_seconds 3: ran after {:.0} ms; past run_at: ran after {:.0} ms",
        waited.as_secs_f64() * 1000.0,
        ran_now.duration_since(sent).as_secs_f64() * 1000.0
    );
    assert!(waited >= Duration::from_millis(2_900), "ran after {waited:?}, before it was due");
    assert!(ran_now < ran_later);
    let done = fleet.wait_status(&delayed, "succeeded", Duration::from_secs(10)).await;
    assert_eq!(done["attempts"].as_array().unwrap().len(), 1, "waiting spent no attempt: {done}");
    assert_eq!(receiver.side_effects(&delayed), 1);

    // Both fields at once, or too far ahead, is refused.
    let (status, body) = fleet
        .post(
            "/v1/tool-calls",
            &json!({"tool_name": "echo", "parameters": {"query": "x"}, "run_at": past, "delay_seconds": 1}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let far = rfc3339_from_millis(before_ms + 31 * 86_400_000);
    let (status, body) =
        fleet.post("/v1/tool-calls", &json!({"tool_name": "echo", "parameters": {"query": "x"}, "run_at": far})).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().starts_with("run_at: "), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_batch_is_answered_per_call_and_its_retry_runs_each_call_once() {
    let receiver = Receiver::echo(SECRET).await;
    let proxy = Proxy::start("127.0.0.1:5672".parse().unwrap()).await;
    // Long enough that even a loaded machine gets the publishes onto the wire before they time out.
    let mut options = FleetOptions::default().env("FLEET_PUBLISH_TIMEOUT", "4").env("FLEET_CLAIM_LEASE", "3");
    options.dispatcher_amqp_url = Some(format!("amqp://guest:guest@{}/%2f", proxy.addr));
    let fleet = spawn_fleet(options).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let calls: Vec<Value> = (0..3).map(|i| call(&format!("q{i}"))).collect();

    // The publishes reach the broker (the worker runs them) but no confirm comes back.
    proxy.freeze_replies();
    let (status, first, _) = post_batch(&fleet, Some("unconfirmed-batch"), &calls).await;
    proxy.thaw();
    assert_eq!(status, 207, "not every call was confirmed: {first}");
    assert_eq!((first["data"]["accepted"].as_u64(), first["data"]["failed"].as_u64()), (Some(0), Some(3)), "{first}");
    for c in first["data"]["calls"].as_array().unwrap() {
        assert_eq!(c["error"]["code"], "outcome_unknown", "{first}");
        assert!(c.get("status").is_none(), "{first}");
    }
    let ids = ids_of(&first);
    // Their records stay: the calls may run (and here they do).
    for id in &ids {
        let (code, _) = fleet.get(&format!("/v1/executions/{id}")).await;
        assert_eq!(code, 200, "{id} is kept");
    }

    // The retry with the key publishes the same executions again and is confirmed.
    let (status, retry, replayed) = post_batch(&fleet, Some("unconfirmed-batch"), &calls).await;
    assert_eq!((status, replayed), (202, false), "{retry}");
    assert_eq!(ids_of(&retry), ids);
    wait_side_effects(&receiver, 3, Duration::from_secs(30)).await;
    for id in &ids {
        fleet.wait_status(id, "succeeded", Duration::from_secs(20)).await;
    }
    // Both copies of every call have been consumed before counting (the second is a no-op).
    wait_for("both copies of each call settled", Duration::from_secs(30), || async {
        let m = fleet.worker_metrics(0).await;
        let settled: f64 = m
            .lines()
            .filter(|l| l.starts_with("fleet_jobs_finished_total{kind=\"tool_call\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        (settled >= 6.0).then_some(())
    })
    .await;
    assert_each_ran_once(&receiver, &ids);
}
