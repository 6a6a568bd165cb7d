//! A publish left unconfirmed because the broker is blocked by a memory alarm. It blocks the
//! shared RabbitMQ (for a few seconds), so `make test` runs this file alone, after every other test.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use fleet_tests::{spawn_fleet, wait_for, Fleet, FleetOptions, Receiver};

const SECRET: &str = "whsec_broker_blocked_secret";

fn rabbitmqctl(args: &[&str]) {
    let out = std::process::Command::new("rabbitmqctl").args(args).output().expect("rabbitmqctl on PATH");
    assert!(out.status.success(), "rabbitmqctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Lifts the memory alarm when dropped, also when the test panics.
struct UnblockOnDrop(Instant);

impl Drop for UnblockOnDrop {
    fn drop(&mut self) {
        rabbitmqctl(&["set_vm_memory_high_watermark", "0.4"]);
        eprintln!("the broker was blocked for {:?}", self.0.elapsed());
    }
}

async fn post_with_key(fleet: &Fleet, key: &str, body: &Value) -> (u16, Value) {
    let resp = fleet
        .http
        .post(format!("{}/v1/tool-calls", fleet.api))
        .bearer_auth(&fleet.token)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .expect("dispatcher reachable");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_unconfirmed_while_the_broker_is_blocked_keeps_its_execution() {
    let receiver = Receiver::echo(SECRET).await;
    // Short leases and delays: a second copy that arrives while the first runs waits little.
    let fleet = spawn_fleet(
        FleetOptions::default()
            .env("FLEET_PUBLISH_TIMEOUT", "2")
            .env("FLEET_CLAIM_LEASE", "3")
            .env("FLEET_RETRY_DELAYS", "0.5,1"),
    )
    .await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let body = json!({"tool_name": "echo", "parameters": {"query": "blocked"}});

    let (first_status, first) = {
        let _unblock = UnblockOnDrop(Instant::now());
        rabbitmqctl(&["set_vm_memory_high_watermark", "0.0000001"]);
        post_with_key(&fleet, "blocked-1", &body).await
    };
    eprintln!("observed while blocked: {first_status} {first}");
    let first_id = first["error"]["execution_id"].as_str().unwrap_or("").to_string();

    // Once unblocked, the broker takes the frame it held; the retry must not make a second job.
    let (retry_status, retry) = wait_for("the retry to be answered", Duration::from_secs(30), || async {
        let answer = post_with_key(&fleet, "blocked-1", &body).await;
        (answer.0 != 409 && answer.0 != 503).then_some(answer)
    })
    .await;
    let retry_id = retry["data"]["execution_id"].as_str().unwrap_or("").to_string();
    fleet.wait_status(&retry_id, "succeeded", Duration::from_secs(30)).await;
    wait_for("both copies consumed", Duration::from_secs(30), || async {
        let m = fleet.worker_metrics(0).await;
        let done: f64 = m
            .lines()
            .filter(|l| {
                l.starts_with("fleet_jobs_finished_total{kind=\"tool_call\"")
                    && (l.contains("\"success\"") || l.contains("\"duplicate\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        (done >= 2.0).then_some(())
    })
    .await;
    let calls = receiver.received().len();
    let observed = format!("blocked: {first_status} {first}; retry: {retry_status} {retry}; calls: {calls}");
    eprintln!("observed: {observed}");
    assert_eq!(first_status, 503, "{observed}");
    assert_eq!(first["error"]["code"], "outcome_unknown", "{observed}");
    assert_eq!(retry_status, 202, "{observed}");
    assert_eq!(retry_id, first_id, "the retry returns the same execution: {observed}");
    assert_eq!(calls, 1, "{observed}");
}

/// A dead letter's retry whose publish the blocked broker never confirms leaves the dead letter
/// where it was: it is removed only once its job is confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_stays_until_its_retried_job_is_confirmed() {
    // Every call is refused for good (404): the call is dead-lettered at once.
    let receiver = Receiver::start(SECRET, |_, _| fleet_tests::Reply::status(404)).await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_PUBLISH_TIMEOUT", "2")).await;
    fleet.register_tool("refuses", &receiver.url("/refuses"), SECRET).await;
    let id = fleet.call_tool("refuses", json!({"query": "q"})).await;
    fleet.wait_status(&id, "dead_lettered", Duration::from_secs(30)).await;
    let letter = format!("/v1/dead-letters/{id}");
    wait_for("the dead letter", Duration::from_secs(30), || async {
        (fleet.get(&letter).await.0 == 200).then_some(())
    })
    .await;

    let (blocked_status, blocked) = {
        let _unblock = UnblockOnDrop(Instant::now());
        rabbitmqctl(&["set_vm_memory_high_watermark", "0.0000001"]);
        let answer = fleet.request(reqwest::Method::POST, &format!("{letter}/retry"), None).await;
        let kept = fleet.get(&letter).await.0;
        assert_eq!(kept, 200, "the dead letter is kept while its retry is unconfirmed: {answer:?}");
        answer
    };
    assert!(blocked_status >= 500, "an unconfirmed retry is not a success: {blocked_status} {blocked}");
    assert_eq!(fleet.get(&letter).await.0, 200, "the dead letter is still there once the broker is back");
    // The broker may still take the frame it held (the 503 said the outcome is unknown): then
    // that retry runs, and another is refused while it runs, or taken as a retry of its own once
    // it has failed again. Each retry runs the call once at most.
    let (status, body) = wait_for("a retry answered", Duration::from_secs(30), || async {
        let answer = fleet.request(reqwest::Method::POST, &format!("{letter}/retry"), None).await;
        (answer.0 < 500).then_some(answer)
    })
    .await;
    let live = body["error"]["code"] == "execution_live";
    assert!((200..300).contains(&status) || live, "the retry once the broker is back: {status} {body}");
    wait_for("the call run again", Duration::from_secs(30), || async {
        (receiver.received().len() >= 2).then_some(())
    })
    .await;
    fleet.wait_status(&id, "dead_lettered", Duration::from_secs(30)).await;
    let calls = receiver.received().len();
    assert!(calls <= 3, "the original call and at most one run per retry: {calls} ({status} {body})");
    // The call failed again: its dead letter is back.
    wait_for("the dead letter back", Duration::from_secs(30), || async {
        (fleet.get(&letter).await.0 == 200).then_some(())
    })
    .await;
}
