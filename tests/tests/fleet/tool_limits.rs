//! Per-tool limits across a fleet of real processes: `max_concurrency` bounds the callbacks in
//! flight to one tool across every worker, `rate_limit` paces them, and a call over either waits
//! in the broker without spending an attempt. The receiver measures both.

use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::Method;
use serde_json::{json, Value};

use fleet_tests::{spawn_fleet, Fleet, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_tool_limits_secret";

/// Registers `name` calling back to `url`, with the extra (limit) fields in `limits`.
async fn register(fleet: &Fleet, name: &str, url: &str, limits: Value) -> Value {
    let mut body = json!({
        "description": "a limited tool",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        "callback_url": url,
        "callback_secret": SECRET,
    });
    body.as_object_mut().unwrap().extend(limits.as_object().unwrap().clone());
    let (status, resp) = fleet.request(Method::PUT, &format!("/v1/tools/{name}"), Some(&body)).await;
    assert_eq!(status, 201, "{resp}");
    resp["data"].clone()
}

/// Enqueues `n` calls of `tool`, several at a time, and returns their execution ids.
async fn call_many(fleet: &Fleet, tool: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(10) {
        let calls = chunk.iter().map(|i| fleet.call_tool(tool, json!({"query": format!("q{i}")})));
        ids.extend(join_all(calls).await);
    }
    ids
}

/// Every call succeeded with one attempt, attempt 1 (no deferral was spent or recorded), and the
/// receiver saw each exactly once.
async fn assert_each_ran_once(fleet: &Fleet, receiver: &Receiver, ids: &[String]) {
    for id in ids {
        let record = fleet.wait_status(id, "succeeded", Duration::from_secs(120)).await;
        let attempts = record["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{id}: {record}");
        assert_eq!(attempts[0]["attempt"], 1, "{id}: {record}");
        assert_eq!(receiver.received_for(id).len(), 1, "{id} was sent once");
        assert_eq!(receiver.side_effects(id), 1, "{id}");
    }
}

/// The sum over the fleet's workers of `fleet_tool_deferred_total` for `tool` and `reason`.
async fn deferrals(fleet: &Fleet, workers: usize, tool: &str, reason: &str) -> f64 {
    let (tool, reason) = (format!("tool=\"{tool}\""), format!("reason=\"{reason}\""));
    let mut total = 0.0;
    for index in 0..workers {
        let text = fleet.worker_metrics(index).await;
        let series = text.lines().filter(|l| l.starts_with("fleet_tool_deferred_total{"));
        let mut matching = series.filter(|l| l.contains(&tool) && l.contains(&reason));
        total += matching.next().and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0);
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_validated_shown_kept_and_removed() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    let url = "http://127.0.0.1:9/limited";
    let data = register(&fleet, "limited", url, json!({"max_concurrency": 2, "rate_limit": {"per_second": 5}})).await;
    assert_eq!(data["max_concurrency"], 2);
    assert_eq!(data["rate_limit"], json!({"per_second": 5.0, "burst": 1}), "burst defaults to 1");
    let plain = register(&fleet, "plain", url, json!({})).await;
    assert_eq!((&plain["max_concurrency"], &plain["rate_limit"]), (&Value::Null, &Value::Null), "no limits by default");

    let bad = [
        (json!({"max_concurrency": 0}), "max_concurrency"),
        (json!({"max_concurrency": "2"}), "max_concurrency"),
        (json!({"rate_limit": {"per_second": 0, "burst": 1}}), "rate_limit.per_second"),
        (json!({"rate_limit": {"per_second": 5, "burst": 0}}), "rate_limit.burst"),
        (json!({"rate_limit": 5}), "rate_limit"),
    ];
    for (body, field) in bad {
        let (status, resp) = fleet.request(Method::PUT, "/v1/tools/limited", Some(&body)).await;
        assert_eq!(status, 422, "{body}: {resp}");
        let message = resp["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{body}: {message}");
    }

    // An update that names neither keeps both; null removes one.
    let (status, resp) = fleet.request(Method::PUT, "/v1/tools/limited", Some(&json!({"description": "d"}))).await;
    assert_eq!((status, &resp["data"]["max_concurrency"]), (200, &json!(2)), "{resp}");
    let body = json!({"rate_limit": null, "max_concurrency": 3});
    let (status, resp) = fleet.request(Method::PUT, "/v1/tools/limited", Some(&body)).await;
    assert_eq!(status, 200, "{resp}");
    let (_, shown) = fleet.get("/v1/tools/limited").await;
    assert_eq!((&shown["data"]["max_concurrency"], &shown["data"]["rate_limit"]), (&json!(3), &Value::Null));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrency_holds_across_three_workers_and_spends_no_attempt() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::result(json!("ok")).after(Duration::from_millis(200))).await;
    let workers = 3;
    let fleet = spawn_fleet(FleetOptions::default().workers(workers)).await;
    register(&fleet, "narrow", &receiver.url("/narrow"), json!({"max_concurrency": 2})).await;

    let started = Instant::now();
    let ids = call_many(&fleet, "narrow", 30).await;
    assert_each_ran_once(&fleet, &receiver, &ids).await;
    let most = receiver.max_concurrent();
    let deferred = deferrals(&fleet, workers, "narrow", "concurrency").await;
    println!(
        "max_concurrency 2, 3 workers, 30 calls of 200 ms: at most {most} at the receiver at once; \
         {deferred} deferrals; all done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(most, 2, "never more than the limit, and the limit was used");
    assert!(deferred > 0.0, "calls over the limit were deferred");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_paces_a_backlog_across_three_workers() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::result(json!("ok"))).await;
    let workers = 3;
    let fleet = spawn_fleet(FleetOptions::default().workers(workers)).await;
    register(&fleet, "paced", &receiver.url("/paced"), json!({"rate_limit": {"per_second": 5, "burst": 1}})).await;

    // 75 calls: 15 s of work at 5/s, more than the measured window needs.
    let ids = call_many(&fleet, "paced", 75).await;
    assert_each_ran_once(&fleet, &receiver, &ids).await;
    let mut times: Vec<Instant> = receiver.received().iter().map(|r| r.at).collect();
    times.sort();
    // The window starts a second after the first delivery, past the start where no call can yet
    // be late, and ends well before the backlog ran out.
    let start = times[0] + Duration::from_secs(1);
    let end = start + Duration::from_secs(10);
    let delivered = times.iter().filter(|t| **t >= start && **t < end).count();
    assert!(*times.last().unwrap() > end, "the backlog lasted past the window");
    let span = times.last().unwrap().duration_since(times[0]).as_secs_f64();
    let deferred = deferrals(&fleet, workers, "paced", "rate_limit").await;
    println!(
        "rate_limit 5/s burst 1, 75 calls on 3 workers: {delivered} delivered in the 10 s window; \
         75 over {span:.1} s ({:.2}/s overall); {deferred} deferrals",
        74.0 / span
    );
    assert!((45..=55).contains(&delivered), "50 ± 5 in 10 s at 5/s, got {delivered}");
    assert!(deferred > 0.0, "calls over the rate were deferred");
}
