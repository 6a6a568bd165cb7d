//! Dead-letter operations through the API and `fleetctl`: list with filters, retry one (same
//! execution id, fresh attempts), a retried job that already succeeded is not run again, bulk
//! redrive, purge with a count.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::BasicProperties;
use serde_json::{json, Value};

use fleet_tests::{spawn_fleet, wait_for, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_dead_letter_tests_1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_can_be_listed_retried_redriven_and_purged() {
    let healthy = Arc::new(AtomicBool::new(false));
    let up = healthy.clone();
    let receiver = Receiver::start(SECRET, move |_, _| {
        if up.load(Ordering::SeqCst) {
            Reply::result(json!("recovered"))
        } else {
            Reply::status(404)
        }
    })
    .await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("alpha", &receiver.url("/alpha"), SECRET).await;
    fleet.register_tool("beta", &receiver.url("/beta"), SECRET).await;
    let a1 = fleet.call_tool("alpha", json!({"query": "1"})).await;
    let a2 = fleet.call_tool("alpha", json!({"query": "2"})).await;
    let b1 = fleet.call_tool("beta", json!({"query": "3"})).await;
    for id in [&a1, &a2, &b1] {
        fleet.wait_status(id, "dead_lettered", Duration::from_secs(20)).await;
    }
    let dlq = fleet.topology.dead_letter_queue();
    assert_eq!(fleet.queue_depth(&dlq).await, 3);

    let (status, listed) = fleet.get("/v1/dead-letters?tool_name=alpha").await;
    assert_eq!(status, 200);
    let ids: Vec<&str> =
        listed["data"].as_array().unwrap().iter().map(|r| r["execution_id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&a1.as_str()) && ids.contains(&a2.as_str()));
    let (_, page) = fleet.get("/v1/dead-letters?limit=1").await;
    assert_eq!(page["data"].as_array().unwrap().len(), 1);
    let cursor = page["next_cursor"].as_str().expect("a next page");
    let (_, rest) = fleet.get(&format!("/v1/dead-letters?limit=5&cursor={cursor}")).await;
    assert_eq!(rest["data"].as_array().unwrap().len(), 2);
    let (status, _) = fleet.get("/v1/dead-letters?since=yesterday").await;
    assert_eq!(status, 422);

    // Retry one: same execution id, fresh attempt count, off the dead-letter queue once confirmed.
    healthy.store(true, Ordering::SeqCst);
    let (status, body) = fleet.post(&format!("/v1/dead-letters/{a1}/retry"), &json!({})).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["data"]["execution_id"], a1.as_str());
    let done = fleet.wait_status(&a1, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(done["result"], "recovered");
    let attempts = done["attempts"].as_array().unwrap();
    assert_eq!(attempts.last().unwrap()["attempt"], 1, "the replay starts a fresh attempt count");
    assert_eq!(fleet.queue_depth(&dlq).await, 2);
    let (status, _) = fleet.get(&format!("/v1/dead-letters/{a1}")).await;
    assert_eq!(status, 404);
    let (status, _) = fleet.post(&format!("/v1/dead-letters/{a1}/retry"), &json!({})).await;
    assert_eq!(status, 404, "it is no longer dead-lettered");

    // A stale copy of a dead letter whose job has since succeeded: retrying it runs nothing.
    let calls_before = receiver.received_for(&a1).len();
    let record = json!({"execution_id": a1, "tool_name": "alpha", "assistant_id": "asst_1", "room_id": "room_1",
        "attempts": 1, "last_error": "HTTP 404", "first_attempt_at": null, "last_attempt_at": null, "reason": "permanent",
        "dead_lettered_at": "2026-01-01T00:00:00Z", "history": [],
        "job": done_job(&a1)});
    let (conn, channel) = fleet.amqp().await;
    channel.confirm_select(Default::default()).await.unwrap();
    channel
        .basic_publish(
            fleet.topology.dead_letter_exchange().as_str().into(),
            "".into(),
            BasicPublishOptions::default(),
            record.to_string().as_bytes(),
            BasicProperties::default().with_content_type("application/json".into()).with_delivery_mode(2),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let _ = conn.close(200, "".into()).await;
    let (status, _) = fleet.post(&format!("/v1/dead-letters/{a1}/retry"), &json!({})).await;
    assert_eq!(status, 202);
    wait_for("the replay to be recognised as a duplicate", Duration::from_secs(20), || async {
        let m = fleet.worker_metrics(0).await;
        m.lines().any(|l| l.starts_with("fleet_idempotency_hits_total{kind=\"tool_call\"} 1")).then_some(())
    })
    .await;
    assert_eq!(receiver.received_for(&a1).len(), calls_before, "a succeeded job is not run again");

    // Bulk redrive by tool, at a bounded rate.
    let (status, body) =
        fleet.post("/v1/dead-letters/retry", &json!({"tool_name": "beta", "rate_per_second": 20})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["done"], 1);
    fleet.wait_status(&b1, "succeeded", Duration::from_secs(20)).await;

    // fleetctl sees the one left, and purges it with a count.
    let listed = fleetctl(&fleet, &["dead-letters", "list"]);
    assert!(listed.contains(&a2), "{listed}");
    assert!(fleetctl(&fleet, &["dead-letters", "list", "--tool", "alpha"]).contains(&a2));
    assert!(!fleetctl(&fleet, &["dead-letters", "list", "--tool", "beta"]).contains(&a2));
    assert!(fleetctl(&fleet, &["dead-letters", "show", &a2]).contains("\"history\""));
    let queues = fleetctl(&fleet, &["queues"]);
    assert!(queues.contains(&dlq), "{queues}");
    let refused = fleetctl_status(&fleet, &["dead-letters", "purge", "--all"]);
    assert!(!refused.success(), "purge needs --yes");
    let purged = fleetctl(&fleet, &["dead-letters", "purge", "--all", "--reason", "permanent", "--yes"]);
    assert!(purged.contains("purged 1 dead letter"), "{purged}");
    assert_eq!(fleet.queue_depth(&dlq).await, 0);
    let (_, listed) = fleet.get("/v1/dead-letters").await;
    assert_eq!(listed["data"], json!([]));
}

fn done_job(id: &str) -> Value {
    json!({"v": 1, "execution_id": id, "attempt": 1, "enqueued_at_ms": 1, "kind": "tool_call",
        "tool_name": "alpha", "parameters": {"query": "1"}, "room_id": "room_1", "assistant_id": "asst_1"})
}

fn fleetctl_command(fleet: &fleet_tests::Fleet, args: &[&str]) -> std::process::Command {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let mut cmd = std::process::Command::new(dir.join("fleetctl"));
    cmd.args(args)
        .env("FLEET_AMQP_URL", fleet_tests::amqp_url())
        .env("FLEET_REDIS_URL", fleet_tests::redis_url())
        .env("FLEET_TOPOLOGY_PREFIX", fleet.topology.prefix())
        .env("FLEET_REDIS_KEY_PREFIX", &fleet.key_prefix);
    cmd
}

fn fleetctl(fleet: &fleet_tests::Fleet, args: &[&str]) -> String {
    let out = fleetctl_command(fleet, args).output().expect("run fleetctl");
    assert!(out.status.success(), "fleetctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn fleetctl_status(fleet: &fleet_tests::Fleet, args: &[&str]) -> std::process::ExitStatus {
    fleetctl_command(fleet, args).output().expect("run fleetctl").status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_never_skips_dead_letters_of_the_same_millisecond() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    let keys = fleet_protocol::keys::Keys::new(&fleet.key_prefix);
    let client = redis::Client::open(fleet_tests::redis_url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let ids = ["exec_same_a", "exec_same_b", "exec_same_c", "exec_other"];
    for (n, id) in ids.iter().enumerate() {
        let at: i64 = if n < 3 { 1_768_910_400_000 } else { 1_768_910_300_000 };
        let record = json!({"execution_id": id, "tool_name": "t", "assistant_id": null, "room_id": null, "attempts": 1,
            "last_error": "HTTP 404", "first_attempt_at": null, "last_attempt_at": null, "reason": "permanent",
            "dead_lettered_at": "2026-01-20T12:00:00Z", "history": []});
        let _: () =
            redis::cmd("SET").arg(keys.dead_letter(id)).arg(record.to_string()).query_async(&mut con).await.unwrap();
        let _: () =
            redis::cmd("ZADD").arg(keys.dead_letters_index()).arg(at).arg(id).query_async(&mut con).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..6 {
        let path = match &cursor {
            Some(c) => format!("/v1/dead-letters?limit=1&cursor={c}"),
            None => "/v1/dead-letters?limit=1".to_string(),
        };
        let (status, page) = fleet.get(&path).await;
        assert_eq!(status, 200, "{page}");
        for r in page["data"].as_array().unwrap() {
            seen.push(r["execution_id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, ["exec_same_c", "exec_same_b", "exec_same_a", "exec_other"], "newest first, none skipped");
}
