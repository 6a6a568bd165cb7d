//! A tool's own retry schedule (`retry: {attempts, delays}`), end to end with real processes:
//! the API's checks, a short schedule dead-lettering on its own count, a tool down for 90 s under
//! a ~8-minute schedule losing nothing, and a 2 h wait held in the broker's 1 h park queue.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::Method;
use serde_json::{json, Value};

use fleet_protocol::envelope::{Envelope, Job, JobKind, ToolCallJob};
use fleet_tests::{metric, spawn_fleet, wait_for, Fleet, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_retry_policy_test";

/// Registers `name` at `url` with `retry` (PUT), asserting it was stored as given.
async fn register_with_retry(fleet: &Fleet, name: &str, url: &str, retry: Value) {
    let body = json!({"callback_url": url, "callback_secret": SECRET, "retry": retry});
    let (status, resp) = fleet.request(Method::PUT, &format!("/v1/tools/{name}"), Some(&body)).await;
    assert!(status == 201 || status == 200, "register {name}: {status} {resp}");
    assert_eq!(resp["data"]["retry"], retry);
}

/// Messages ready in every delay queue of `kind` (retry delay queues and park queues).
async fn parked(fleet: &Fleet, kind: JobKind) -> u32 {
    let mut total = 0;
    for step in 0..fleet.topology.ladder().len() {
        total += fleet.queue_depth(&fleet.topology.delay_queue(kind, step)).await;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_field_is_checked_shown_kept_and_cleared() {
    let fleet = spawn_fleet(FleetOptions { workers: 0, ..FleetOptions::default() }).await;
    let svix = json!({"attempts": 8, "delays": [5, 300, 1800, 7200, 18000, 36000, 36000]});
    register_with_retry(&fleet, "svix_like", "http://127.0.0.1:9/x", svix.clone()).await;
    // An update that does not name `retry` keeps it; GET shows it.
    let (status, _) = fleet.request(Method::PUT, "/v1/tools/svix_like", Some(&json!({"description": "kept"}))).await;
    assert_eq!(status, 200);
    let (_, got) = fleet.get("/v1/tools/svix_like").await;
    assert_eq!(got["data"]["retry"], svix);
    for (bad, names) in [
        (json!({"attempts": 0, "delays": []}), "retry.attempts"),
        (json!({"attempts": 21, "delays": vec![1; 20]}), "retry.attempts"),
        (json!({"attempts": 3, "delays": [5]}), "retry.delays"),
        (json!({"attempts": 2, "delays": [0]}), "retry.delays[0]"),
        (json!({"attempts": 3, "delays": [200000, 100000]}), "retry.delays"),
        (json!({"attempts": 2, "delays": [1.5]}), "retry.delays"),
        (json!({"attempts": 2, "delays": [5], "jitter": true}), "retry"),
    ] {
        let (status, resp) = fleet.request(Method::PUT, "/v1/tools/svix_like", Some(&json!({"retry": bad}))).await;
        assert_eq!(status, 422, "{bad} must be refused: {resp}");
        let message = resp["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(names), "the error names {names}: {resp}");
    }
    let (_, got) = fleet.get("/v1/tools/svix_like").await;
    assert_eq!(got["data"]["retry"], svix, "a refused update changed nothing");
    // `null` goes back to the fleet's default.
    let (status, resp) = fleet.request(Method::PUT, "/v1/tools/svix_like", Some(&json!({"retry": null}))).await;
    assert_eq!((status, &resp["data"]["retry"]), (200, &Value::Null));
    // Webhooks take the same field.
    let hook = json!({"url": "http://127.0.0.1:9/h", "secret": SECRET, "events": ["agent.room.message"],
        "retry": {"attempts": 2, "delays": [60]}});
    let (status, resp) = fleet.request(Method::PUT, "/v1/webhooks/retry_hook", Some(&hook)).await;
    assert_eq!((status, &resp["data"]["retry"]), (201, &json!({"attempts": 2, "delays": [60]})), "{resp}");
    let bad_hook = json!({"retry": {"attempts": 2, "delays": []}});
    let (status, resp) = fleet.request(Method::PUT, "/v1/webhooks/retry_hook", Some(&bad_hook)).await;
    assert_eq!(status, 422, "{resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_schedule_dead_letters_after_its_own_attempt_count() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(503)).await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    register_with_retry(&fleet, "short", &receiver.url("/short"), json!({"attempts": 3, "delays": [1, 2]})).await;
    let id = fleet.call_tool("short", json!({"query": "x"})).await;
    let done = fleet.wait_status(&id, "dead_lettered", Duration::from_secs(30)).await;
    assert_eq!(receiver.received_for(&id).len(), 3, "three attempts, not the default's six");
    let attempts: Vec<u64> =
        done["attempts"].as_array().unwrap().iter().map(|a| a["attempt"].as_u64().unwrap()).collect();
    assert_eq!(attempts, [1, 2, 3]);
    assert_eq!(done["attempts"][2]["outcome"], "exhausted");
    let (status, dl) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
    assert_eq!(status, 200, "{dl}");
    assert_eq!((dl["data"]["attempts"].as_u64(), dl["data"]["reason"].as_str()), (Some(3), Some("exhausted")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_down_for_90_s_under_a_long_schedule_loses_nothing() {
    const CALLS: usize = 20;
    let outage = Duration::from_secs(90);
    let start = Instant::now();
    let receiver = Receiver::start(SECRET, move |r, _| {
        if r.at.duration_since(start) < outage {
            Reply::status(503)
        } else {
            Reply::result(json!("ok"))
        }
    })
    .await;
    let fleet = spawn_fleet(FleetOptions::default().workers(2)).await;
    // 8 attempts over 500 s (8.3 min): the default's 31 s window would dead-letter every call.
    let schedule = json!({"attempts": 8, "delays": [5, 10, 20, 30, 45, 90, 300]});
    register_with_retry(&fleet, "deploying", &receiver.url("/deploying"), schedule).await;
    let tap = fleet.dead_letter_tap().await;
    let mut ids = Vec::new();
    for i in 0..CALLS {
        ids.push(fleet.call_tool("deploying", json!({"query": format!("call {i}")})).await);
    }
    // While the tool is down, the calls wait in the broker's delay queues, not in a worker.
    wait_for("every call parked in the broker mid-outage", Duration::from_secs(80), || async {
        (parked(&fleet, JobKind::ToolCall).await == CALLS as u32).then_some(())
    })
    .await;
    let mut in_flight = 0.0;
    for w in 0..2 {
        in_flight += metric(&fleet.worker_metrics(w).await, "fleet_jobs_in_flight{kind=\"tool_call\"}");
    }
    assert_eq!(in_flight, 0.0, "no worker holds a waiting call");

    let mut succeeded = HashMap::new();
    for id in &ids {
        succeeded.insert(id.clone(), fleet.wait_status(id, "succeeded", Duration::from_secs(300)).await);
    }
    let all_done = start.elapsed();
    let mut attempts_used = Vec::new();
    for id in &ids {
        let got = receiver.received_for(id);
        let successes = got.iter().filter(|r| r.at.duration_since(start) >= outage).count();
        assert_eq!(successes, 1, "{id} reached the receiver successfully exactly once");
        assert!(got.iter().all(|r| r.verified.is_ok()));
        assert_eq!(receiver.side_effects(id), 1);
        let record = &succeeded[id];
        let recorded = record["attempts"].as_array().unwrap();
        assert_eq!(recorded.len(), got.len(), "every attempt is in the record");
        attempts_used.push(got.len());
    }
    let lost = ids.iter().filter(|id| receiver.side_effects(id) == 0).count();
    let dead = tap.depth().await;
    attempts_used.sort();
    println!(
        "outage 90 s, {CALLS} calls, schedule 5/10/20/30/45/90/300 s: lost {lost}, dead-lettered {dead}, \
         attempts used {}..{} (total requests {}), all succeeded after {:.1} s",
        attempts_used[0],
        attempts_used[CALLS - 1],
        receiver.received().len(),
        all_done.as_secs_f64()
    );
    assert_eq!((lost, dead), (0, 0));
    // Attempt 5 runs ~65 s after the first (before the tool is back), attempt 6 ~110 s after it.
    assert!(attempts_used.iter().all(|n| (5..=7).contains(n)), "attempts used: {attempts_used:?}");
    assert_eq!(receiver.total_side_effects(), CALLS as u32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_hour_wait_is_held_in_the_hour_park_queue() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(503)).await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    register_with_retry(&fleet, "slow_owner", &receiver.url("/slow"), json!({"attempts": 2, "delays": [7200]})).await;
    let id = fleet.call_tool("slow_owner", json!({"query": "x"})).await;
    let hour_queue = fleet.topology.park_queue(JobKind::ToolCall, Duration::from_secs(7200));
    assert!(hour_queue.ends_with(".delay.tool_calls.3600s"), "{hour_queue}");
    wait_for("the retry in the 1 h park queue", Duration::from_secs(30), || async {
        (fleet.queue_depth(&hour_queue).await == 1).then_some(())
    })
    .await;
    assert_eq!(parked(&fleet, JobKind::ToolCall).await, 1, "held once, in that queue only");
    assert_eq!(fleet.waiting_depth(JobKind::ToolCall).await, 0);
    let (_, record) = fleet.get(&format!("/v1/executions/{id}")).await;
    assert_eq!(record["data"]["status"], "retrying");
    assert_eq!(record["data"]["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(receiver.received_for(&id).len(), 1, "nothing more is sent while it waits");
    // Counted once the retry's publish is confirmed, a moment after the queue shows it.
    let metrics = wait_for("the retry counted", Duration::from_secs(10), || async {
        let m = fleet.worker_metrics(0).await;
        let counted = m.lines().any(|l| {
            l.starts_with("fleet_retries_scheduled_total{")
                && l.contains("attempt=\"2\"")
                && l.contains("kind=\"tool_call\"")
                && l.ends_with(" 1")
        });
        counted.then_some(m)
    })
    .await;
    assert_eq!(metric(&metrics, "fleet_jobs_in_flight{kind=\"tool_call\"}"), 0.0, "no worker holds it");

    // A job back from a hop with 65 min still to wait goes to the 1 h queue again; one with 90 s
    // to wait, to the 1 min queue: the worker re-parks it until it is due, spending no attempt.
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    for (n, remaining) in [(1, 65 * 60_000), (2, 90_000)] {
        let job = Job::ToolCall(ToolCallJob {
            tool_name: "slow_owner".into(),
            parameters: json!({"query": "x"}),
            room_id: None,
            assistant_id: None,
            parent: None,
        });
        let returned = Envelope {
            attempt: 2,
            not_before_ms: Some(now + remaining),
            ..Envelope::new(format!("exec_returned{n}"), job, now)
        };
        fleet.publish_envelope(&returned).await;
    }
    let minute_queue = fleet.topology.park_queue(JobKind::ToolCall, Duration::from_secs(90));
    assert!(minute_queue.ends_with(".delay.tool_calls.60s"), "{minute_queue}");
    wait_for("both re-parked", Duration::from_secs(30), || async {
        let hour = fleet.queue_depth(&hour_queue).await;
        let minute = fleet.queue_depth(&minute_queue).await;
        (hour == 2 && minute == 1).then_some(())
    })
    .await;
    assert_eq!(receiver.received().len(), 1, "a re-parked job sends nothing");
}
