//! Endpoint health per tool, with real processes: a tool whose receiver keeps answering 503 opens
//! its circuit after its threshold; while open its calls are deferred in the broker (not
//! dead-lettered) and the receiver sees at most one probe per probe interval; once it recovers a
//! probe closes the circuit and every deferred call succeeds exactly once. A turn's call of a tool
//! whose circuit is open is answered `tool_unavailable` at once, and `fleetctl` closes a circuit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use fleet_protocol::timefmt::millis_from_rfc3339;
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
use fleet_tests::{spawn_fleet, wait_for, Fleet, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_circuit_tests_secret_1";

/// A receiver that answers 503 until `up` is set, then a result.
async fn switchable_receiver(up: Arc<AtomicBool>) -> Receiver {
    Receiver::start(SECRET, move |r, _| {
        if up.load(Ordering::SeqCst) {
            Reply::result(json!({"ok": r.json["parameters"].clone()}))
        } else {
            Reply::status(503)
        }
    })
    .await
}

async fn register(fleet: &Fleet, name: &str, url: &str, breaker: Value) -> Value {
    let body = json!({"callback_url": url, "callback_secret": SECRET, "circuit_breaker": breaker});
    let (status, resp) = fleet.request(Method::PUT, &format!("/v1/tools/{name}"), Some(&body)).await;
    assert_eq!(status, 201, "{resp}");
    resp["data"].clone()
}

async fn health(fleet: &Fleet, tool: &str) -> Value {
    let (status, resp) = fleet.get(&format!("/v1/tools/{tool}")).await;
    assert_eq!(status, 200, "{resp}");
    resp["data"]["health"].clone()
}

/// The start (epoch ms, in order) of every attempt of `ids` that started after `after_ms`; each was
/// sent and answered 503 (the endpoint is down).
async fn attempt_starts(fleet: &Fleet, ids: &[String], after_ms: i64) -> Vec<i64> {
    let mut starts = vec![];
    for id in ids {
        let (_, view) = fleet.get(&format!("/v1/executions/{id}")).await;
        for attempt in view["data"]["attempts"].as_array().into_iter().flatten() {
            let started = millis_from_rfc3339(attempt["started_at"].as_str().unwrap()).unwrap();
            if started > after_ms {
                assert_eq!(attempt["http_status"], 503, "{attempt}");
                starts.push(started);
            }
        }
    }
    starts.sort_unstable();
    starts
}

async fn wait_state(fleet: &Fleet, tool: &str, state: &str, timeout: Duration) -> Value {
    wait_for(&format!("{tool}'s circuit to be {state}"), timeout, || async {
        let h = health(fleet, tool).await;
        (h["state"] == state).then_some(h)
    })
    .await
}

async fn dispatcher_metrics(fleet: &Fleet) -> String {
    fleet.http.get(format!("{}/metrics", fleet.api)).send().await.unwrap().text().await.unwrap()
}

fn fleetctl(fleet: &Fleet, args: &[&str]) -> String {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let out = std::process::Command::new(dir.join("fleetctl"))
        .args(args)
        .env("FLEET_AMQP_URL", fleet_tests::amqp_url())
        .env("FLEET_REDIS_URL", fleet_tests::redis_url())
        .env("FLEET_TOPOLOGY_PREFIX", fleet.topology.prefix())
        .env("FLEET_REDIS_KEY_PREFIX", &fleet.key_prefix)
        .output()
        .expect("run fleetctl");
    assert!(out.status.success(), "fleetctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_endpoint_opens_its_circuit_defers_its_calls_and_a_probe_closes_it() {
    const CALLS: usize = 6;
    let interval = Duration::from_secs(2);
    let up = Arc::new(AtomicBool::new(false));
    let receiver = switchable_receiver(up.clone()).await;
    let fleet = spawn_fleet(
        FleetOptions::default()
            .workers(2)
            .env("FLEET_RETRY_DELAYS", "0.2,0.4,0.8,1.6,3.2")
            .env("FLEET_STATS_INTERVAL", "0.2"),
    )
    .await;
    let shown = register(
        &fleet,
        "flaky",
        &receiver.url("/flaky"),
        json!({"failure_threshold": 3, "probe_interval_seconds": 2}),
    )
    .await;
    assert_eq!(shown["circuit_breaker"], json!({"failure_threshold": 3, "probe_interval_seconds": 2}));
    let fresh = health(&fleet, "flaky").await;
    assert_eq!(
        fresh,
        json!({"state": "closed", "consecutive_failures": 0, "last_success_at": null, "last_failure_at": null, "opened_at": null, "history": []})
    );

    let ids: Vec<String> = {
        let mut ids = vec![];
        for n in 0..CALLS {
            ids.push(fleet.call_tool("flaky", json!({"n": n})).await);
        }
        ids
    };
    let opened = wait_state(&fleet, "flaky", "open", Duration::from_secs(20)).await;
    assert!(opened["consecutive_failures"].as_u64().unwrap() >= 3, "{opened}");
    assert!(opened["opened_at"].is_string() && opened["last_failure_at"].is_string(), "{opened}");
    assert_eq!(opened["last_success_at"], Value::Null);
    wait_for("the open-circuit gauge", Duration::from_secs(10), || async {
        dispatcher_metrics(&fleet).await.contains("fleet_tool_circuit_open{tool=\"flaky\"} 1").then_some(())
    })
    .await;

    // Stragglers admitted before the circuit opened may start a little after it; from here on
    // every attempt is a probe. The worker's probe slot is taken when it admits a call, so each
    // probe is timed by its attempt's start in the record, not by its arrival at the receiver
    // (a POST can take hundreds of ms to arrive with the machine's cores busy).
    let opened_ms = millis_from_rfc3339(opened["opened_at"].as_str().unwrap()).unwrap();
    let settled_ms = opened_ms + 500;
    let probes = wait_for("three probes while open", Duration::from_secs(30), || async {
        let probes = attempt_starts(&fleet, &ids, settled_ms).await;
        (probes.len() >= 3).then_some(probes)
    })
    .await;
    let window = Duration::from_millis((probes.last().unwrap() - settled_ms) as u64);
    let gaps: Vec<Duration> = probes.windows(2).map(|w| Duration::from_millis((w[1] - w[0]) as u64)).collect();
    println!(
        "probes while open: {} in {:.2} s (interval {} s), gaps {:?}",
        probes.len(),
        window.as_secs_f64(),
        interval.as_secs(),
        gaps
    );
    for gap in &gaps {
        assert!(
            *gap >= interval - Duration::from_millis(300),
            "two probes {gap:?} apart, under the {interval:?} interval"
        );
    }
    let per_interval = probes.len() as f64 / (window.as_secs_f64() / interval.as_secs_f64()).max(1.0);
    println!("probes per interval: {per_interval:.2}");
    assert!(per_interval <= 1.5, "{per_interval} probes per interval");

    // Deferred, not burned: nothing dead-lettered, every call still waiting.
    for id in &ids {
        let (_, view) = fleet.get(&format!("/v1/executions/{id}")).await;
        let status = view["data"]["status"].as_str().unwrap().to_string();
        // `running`: this call is the probe in flight.
        let waiting = ["queued", "retrying", "running"].contains(&status.as_str());
        assert!(waiting, "{id} is {status} while the circuit is open");
        assert!(view["data"]["attempts"].as_array().unwrap().len() <= 6);
    }
    let (_, dead) = fleet.get("/v1/dead-letters").await;
    assert_eq!(dead["data"].as_array().unwrap().len(), 0, "{dead}");
    let open_health = health(&fleet, "flaky").await;
    assert_eq!(open_health["state"], "open");

    // Recovery: the next probe closes the circuit and every deferred call runs, once.
    up.store(true, Ordering::SeqCst);
    let recovered = Instant::now();
    let closed = wait_state(&fleet, "flaky", "closed", Duration::from_secs(15)).await;
    let close_time = recovered.elapsed();
    assert_eq!(closed["consecutive_failures"], 0);
    assert!(closed["last_success_at"].is_string() && closed["opened_at"].is_null(), "{closed}");
    for id in &ids {
        fleet.wait_status(id, "succeeded", Duration::from_secs(20)).await;
    }
    let all_done = recovered.elapsed();
    println!(
        "recovery: circuit closed {:.2} s and all {CALLS} deferred calls succeeded {:.2} s after the endpoint came back",
        close_time.as_secs_f64(),
        all_done.as_secs_f64()
    );
    for id in &ids {
        assert_eq!(receiver.side_effects(id), 1, "{id} ran exactly once");
    }
    assert_eq!(receiver.total_side_effects(), CALLS as u32);
    let (_, dead) = fleet.get("/v1/dead-letters").await;
    assert_eq!(dead["data"].as_array().unwrap().len(), 0, "{dead}");
    wait_for("the gauge to drop the closed circuit", Duration::from_secs(10), || async {
        (!dispatcher_metrics(&fleet).await.contains("fleet_tool_circuit_open{tool=\"flaky\"}")).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_circuit_breaker_field_is_checked_and_kept_on_update() {
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    for bad in [
        json!({"probe_interval_seconds": 0}),
        json!({"failure_threshold": -1}),
        json!({"threshold": 3}),
        json!({"probe_interval_seconds": 86_401}),
    ] {
        let body = json!({"callback_url": receiver.url("/t"), "callback_secret": SECRET, "circuit_breaker": bad});
        let (status, resp) = fleet.request(Method::PUT, "/v1/tools/checked", Some(&body)).await;
        assert_eq!(status, 422, "{bad} refused: {resp}");
    }
    let shown = register(&fleet, "checked", &receiver.url("/t"), json!({"failure_threshold": 0})).await;
    assert_eq!(shown["circuit_breaker"], json!({"failure_threshold": 0}));
    let (status, updated) =
        fleet.request(Method::PUT, "/v1/tools/checked", Some(&json!({"description": "still mine"}))).await;
    assert_eq!(status, 200);
    assert_eq!(updated["data"]["circuit_breaker"], json!({"failure_threshold": 0}), "an update keeps it");
    let plain = fleet
        .request(
            Method::PUT,
            "/v1/tools/plain",
            Some(&json!({"callback_url": receiver.url("/p"), "callback_secret": SECRET})),
        )
        .await;
    assert_eq!(plain.1["data"]["circuit_breaker"], Value::Null, "no field: the fleet's defaults");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleetctl_shows_and_closes_a_circuit() {
    let up = Arc::new(AtomicBool::new(false));
    let receiver = switchable_receiver(up.clone()).await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_RETRY_DELAYS", "0.2,0.4,0.8,1.6,3.2")).await;
    register(&fleet, "stuck", &receiver.url("/stuck"), json!({"failure_threshold": 1, "probe_interval_seconds": 20}))
        .await;
    let id = fleet.call_tool("stuck", json!({})).await;
    wait_state(&fleet, "stuck", "open", Duration::from_secs(15)).await;
    let shown: Value = serde_json::from_str(fleetctl(&fleet, &["circuit", "show", "stuck"]).trim()).unwrap();
    assert_eq!((shown["state"].as_str(), shown["consecutive_failures"].as_u64()), (Some("open"), Some(1)));

    // The endpoint is back; an operator closes the circuit before any probe is due (20 s).
    up.store(true, Ordering::SeqCst);
    let out = fleetctl(&fleet, &["circuit", "close", "stuck"]);
    assert_eq!(out.trim(), "circuit of tool \"stuck\" closed", "it was open until now");
    let h = health(&fleet, "stuck").await;
    assert_eq!((h["state"].as_str(), h["consecutive_failures"].as_u64()), (Some("closed"), Some(0)));
    // The call (retrying, or deferred for at most the probe interval) runs.
    fleet.wait_status(&id, "succeeded", Duration::from_secs(40)).await;
    assert_eq!(receiver.side_effects(&id), 1);
    let again = fleetctl(&fleet, &["circuit", "close", "stuck"]);
    assert!(again.contains("was not open"), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_call_of_an_open_circuit_tool_is_answered_tool_unavailable_at_once() {
    let llm = MockLlm::start(|body, _| {
        let answered = body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool");
        if answered {
            LlmReply::text("The weather service is down.")
        } else {
            LlmReply::ToolCalls(vec![("call_w".into(), "weather".into(), r#"{"city":"Oslo"}"#.into())])
        }
    })
    .await;
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(503)).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    register(
        &fleet,
        "weather",
        &receiver.url("/weather"),
        json!({"failure_threshold": 1, "probe_interval_seconds": 3600}),
    )
    .await;
    // One direct call fails and opens the circuit (no probe for an hour).
    fleet.call_tool("weather", json!({"city": "Bergen"})).await;
    wait_state(&fleet, "weather", "open", Duration::from_secs(15)).await;
    let sent_before = receiver.received().len();

    let id = post_turn(&fleet, &turn_body("s_circuit", "weather in Oslo?", &["weather"])).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["turn"]["final_message"]["content"], "The weather service is down.");
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    let fan_out = requests[0].ended.expect("the tool-call answer ended");
    let answer_time = requests[1].started.duration_since(fan_out);
    println!(
        "open circuit: the model had the tool_unavailable result {} ms after its tool call",
        answer_time.as_millis()
    );
    assert!(answer_time < Duration::from_secs(1), "{answer_time:?}");

    let tool_message = requests[1].messages().into_iter().find(|m| m["role"] == "tool").unwrap();
    let content: Value = serde_json::from_str(tool_message["content"].as_str().unwrap()).unwrap();
    assert_eq!(content["error"], "tool_unavailable", "{content}");
    assert_eq!(content["tool"], "weather");
    assert!(content["unavailable_since"].is_string(), "{content}");
    assert_eq!(receiver.received().len(), sent_before, "the turn's call was never sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_call_queued_when_its_circuit_opens_is_answered_instead_of_waiting() {
    let llm = MockLlm::start(|body, _| {
        let answered = body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool");
        if answered {
            LlmReply::text("Sorry, no stock levels right now.")
        } else {
            LlmReply::ToolCalls(vec![("call_s".into(), "stock".into(), r#"{"sku":"A1"}"#.into())])
        }
    })
    .await;
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(503)).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    register(&fleet, "stock", &receiver.url("/stock"), json!({"failure_threshold": 1, "probe_interval_seconds": 3600}))
        .await;
    // Closed when the model calls it: the call is sent, fails, and opens the circuit. Its retry
    // finds the circuit open and the turn is answered, not left waiting for a probe an hour away.
    let started = Instant::now();
    let id = post_turn(&fleet, &turn_body("s_circuit_late", "stock of A1?", &["stock"])).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    println!("a queued call of a freshly opened circuit: turn done in {} ms", started.elapsed().as_millis());
    assert_eq!(done["turn"]["final_message"]["content"], "Sorry, no stock levels right now.");
    let requests = llm.requests();
    let tool_message = requests[1].messages().into_iter().find(|m| m["role"] == "tool").unwrap();
    let content: Value = serde_json::from_str(tool_message["content"].as_str().unwrap()).unwrap();
    assert_eq!(content["error"], "tool_unavailable", "{content}");
    assert_eq!(receiver.received().len(), 1, "sent once, before the circuit opened");
    let call = done["turn"]["tool_calls"][0]["execution_id"].as_str().unwrap().to_string();
    let (_, view) = fleet.get(&format!("/v1/executions/{call}")).await;
    assert_eq!(view["data"]["status"], "cancelled", "never sent again: {view}");
    assert_eq!(health(&fleet, "stock").await["state"], "open");
}
