//! A worker's own bounds: `FLEET_WORKER_CONCURRENCY` bounds the jobs it runs at once across every
//! kind, a resubscribe does not hand running jobs back to the broker (no forked retry chains), and
//! a worker paused past its lease never writes over a newer status.

use std::time::{Duration, Instant};

use lapin::options::QueueDeleteOptions;
use reqwest::Method;
use serde_json::json;

use fleet_protocol::envelope::JobKind;
use fleet_tests::{metric, spawn_fleet, wait_for, Fleet, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_worker_bounds_secret";

/// Messages ready in every queue of the fleet's topology but the dead-letter queue.
async fn messages_waiting(fleet: &Fleet) -> u32 {
    let mut total = 0;
    for q in fleet.topology.queues() {
        if q.name != fleet.topology.dead_letter_queue() {
            total += fleet.queue_depth(&q.name).await;
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_bounds_jobs_of_every_kind_together() {
    let slow = Duration::from_millis(1500);
    let receiver = Receiver::start(SECRET, move |r, _| match r.path.as_str() {
        "/bad" => Reply::status(400),
        "/slow" => Reply::result(json!("ok")).after(slow),
        _ => Reply::status(200).after(slow), // webhook deliveries
    })
    .await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_WORKER_CONCURRENCY", "4")).await;
    fleet.register_tool("bad", &receiver.url("/bad"), SECRET).await;
    fleet.register_tool("slow", &receiver.url("/slow"), SECRET).await;
    let events = ["tool.callback.failed", "tool.callback.dead_letter"];
    let hook = json!({"url": receiver.url("/events"), "secret": SECRET, "events": events});
    let (status, body) = fleet.request(Method::PUT, "/v1/webhooks/ops", Some(&hook)).await;
    assert_eq!(status, 201, "{body}");

    // Each permanent failure queues two slow webhook deliveries; then slow tool calls join them.
    let mut failed = Vec::new();
    for n in 0..6 {
        failed.push(fleet.call_tool("bad", json!({"query": format!("{n}")})).await);
    }
    for id in &failed {
        fleet.wait_status(id, "dead_lettered", Duration::from_secs(30)).await;
    }
    let mut slow_calls = Vec::new();
    for n in 0..8 {
        slow_calls.push(fleet.call_tool("slow", json!({"query": format!("{n}")})).await);
    }
    for id in &slow_calls {
        fleet.wait_status(id, "succeeded", Duration::from_secs(60)).await;
    }
    wait_for("every webhook delivery", Duration::from_secs(60), || async {
        (receiver.received().iter().filter(|r| r.path == "/events").count() >= 12).then_some(())
    })
    .await;
    let most = receiver.max_concurrent();
    println!("concurrency 4: at most {most} requests at the receiver at once");
    assert!(most <= 4, "concurrency 4, but {most} requests were in flight at once");
    assert_eq!(receiver.received().iter().filter(|r| r.path == "/events").count(), 12, "nothing doubled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resubscribe_does_not_fork_a_retrying_job() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(500).after(Duration::from_millis(1000))).await;
    let fleet = spawn_fleet(
        FleetOptions::default().env("FLEET_RETRY_DELAYS", "0.3,0.3,0.3,0.3,0.3").env("FLEET_CLAIM_LEASE", "2"),
    )
    .await;
    fleet.register_tool("failing", &receiver.url("/failing"), SECRET).await;
    let tap = fleet.dead_letter_tap().await;
    let id = fleet.call_tool("failing", json!({"query": "x"})).await;
    wait_for("attempt 2 in flight", Duration::from_secs(20), || async {
        (receiver.received_for(&id).len() >= 2).then_some(())
    })
    .await;
    // Deleting another kind's work queue cancels that consumer broker-side: the worker resubscribes
    // while the tool call's attempt is still running.
    let (conn, channel) = fleet.amqp().await;
    let queue = fleet.topology.work_queue(JobKind::Webhook);
    channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
    let _ = conn.close(200, "".into()).await;

    fleet.wait_status(&id, "dead_lettered", Duration::from_secs(60)).await;
    // A forked chain would still be running: wait until nothing has arrived for longer than a lease
    // plus a retry wait and no job waits in any queue, then count.
    let quiet = Duration::from_secs(4);
    wait_for("the fleet to fall quiet", Duration::from_secs(60), || async {
        let last = receiver.received().iter().map(|r| r.at).max()?;
        (last.elapsed() > quiet && messages_waiting(&fleet).await == 0).then_some(())
    })
    .await;
    let attempts = receiver.received_for(&id).len();
    let dead = tap.depth().await;
    println!("resubscribe mid-attempt: {attempts} attempts, {dead} dead letters");
    assert_eq!((attempts, dead), (6, 1), "exactly 6 attempts and one dead letter");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_never_writes_over_a_newer_status() {
    // The paused worker's attempt fails (retryable); the new worker's succeeds.
    let receiver = Receiver::start(SECRET, |_, n| {
        if n == 0 {
            Reply::status(503).after(Duration::from_millis(1500))
        } else {
            Reply::result(json!("from the new worker"))
        }
    })
    .await;
    let amqp = format!("{}?heartbeat=1", fleet_tests::amqp_url());
    let mut fleet =
        spawn_fleet(FleetOptions::default().env("FLEET_CLAIM_LEASE", "1").env("FLEET_AMQP_URL", &amqp)).await;
    fleet.register_tool("slow", &receiver.url("/slow"), SECRET).await;
    let id = fleet.call_tool("slow", json!({"query": "x"})).await;
    wait_for("the first callback", Duration::from_secs(10), || async {
        (!receiver.received_for(&id).is_empty()).then_some(())
    })
    .await;
    fleet.signal_worker(0, libc::SIGSTOP);
    let b = fleet.spawn_worker().await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    fleet.signal_worker(0, libc::SIGCONT);
    let resumed = Instant::now();
    // The resumed worker's attempt ends with a 503: either its write is fenced off, or it lands.
    let status = wait_for("the resumed worker's late write", Duration::from_secs(20), || async {
        let m = fleet.worker_metrics(0).await;
        let fenced = metric(&m, "fleet_jobs_finished_total{kind=\"tool_call\",outcome=\"fenced\"}") >= 1.0;
        let (_, body) = fleet.get(&format!("/v1/executions/{id}")).await;
        let status = body["data"]["status"].as_str().unwrap_or_default().to_string();
        (fenced || status != "succeeded").then_some(status)
    })
    .await;
    println!("after the paused worker resumed ({:?}): status {status}", resumed.elapsed());
    assert_eq!(status, "succeeded", "the stale worker wrote {status} over succeeded");
    let (_, body) = fleet.get(&format!("/v1/executions/{id}")).await;
    assert_eq!(body["data"]["status"], "succeeded");
    assert_eq!(body["data"]["result"], "from the new worker");
    assert!(fleet.worker_alive(b));
}
