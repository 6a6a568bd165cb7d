//! What platform teams rely on: SIGTERM drains without losing or doubling work, health that tells
//! the truth (readiness and a liveness watchdog), and broker endpoint failover.

use std::time::{Duration, Instant};

use lapin::options::QueueDeleteOptions;
use lapin::types::FieldTable;
use serde_json::json;

use fleet_tests::proxy::Proxy;
use fleet_tests::{spawn_fleet, wait_for, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_deployment_secret_1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_loses_nothing_and_runs_nothing_twice() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::result(json!("ok")).after(Duration::from_millis(700))).await;
    let mut fleet =
        spawn_fleet(FleetOptions::default().env("FLEET_WORKER_CONCURRENCY", "8").env("FLEET_SHUTDOWN_GRACE", "10"))
            .await;
    fleet.register_tool("slow", &receiver.url("/slow"), SECRET).await;
    let mut ids = Vec::new();
    for n in 0..30 {
        ids.push(fleet.call_tool("slow", json!({"query": format!("{n}")})).await);
    }
    wait_for("the worker to hold a full batch", Duration::from_secs(10), || async {
        (receiver.received().len() >= 8).then_some(())
    })
    .await;
    let in_flight_at_sigterm = receiver.received().len();
    let sent = Instant::now();
    fleet.signal_worker(0, libc::SIGTERM);
    let code = fleet.wait_worker_exit(0, Duration::from_secs(15)).await;
    let exit_time = sent.elapsed();
    assert_eq!(code, Some(0), "the worker exits 0 after draining");
    assert!(exit_time < Duration::from_secs(10), "it finished its jobs within the grace period: {exit_time:?}");
    let finished_by_first = receiver.received().len();
    assert!(finished_by_first >= in_flight_at_sigterm);

    fleet.spawn_worker().await;
    for id in &ids {
        fleet.wait_status(id, "succeeded", Duration::from_secs(30)).await;
    }
    for id in &ids {
        assert_eq!(receiver.received_for(id).len(), 1, "{id} ran exactly once");
    }
    println!(
        "shutdown: {in_flight_at_sigterm} jobs in flight at SIGTERM, worker exited 0 after {:.0} ms, 30/30 succeeded, 0 lost, 0 doubled",
        exit_time.as_secs_f64() * 1000.0
    );

    // The dispatcher stops accepting and exits 0 too.
    let sent = Instant::now();
    assert_eq!(fleet.stop_dispatcher(libc::SIGTERM, Duration::from_secs(10)).await, Some(0));
    assert!(sent.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_cancelled_by_the_broker_is_restored() {
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    // Deleting the queue makes the broker cancel the worker's consumer.
    let (conn, channel) = fleet.amqp().await;
    let queue = fleet.topology.work_queue(fleet_protocol::envelope::JobKind::ToolCall);
    channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
    let _ = conn.close(200, "".into()).await;
    // The worker redeclares and resubscribes by itself; the dispatcher's publishes then land again.
    wait_for("the work queue to be back with a consumer", Duration::from_secs(20), || async {
        let (conn, channel) = fleet.amqp().await;
        let q = channel
            .queue_declare(
                queue.as_str().into(),
                lapin::options::QueueDeclareOptions { passive: true, ..Default::default() },
                FieldTable::default(),
            )
            .await;
        let _ = conn.close(200, "".into()).await;
        q.ok().filter(|q| q.consumer_count() == 1).map(|_| ())
    })
    .await;
    // Readiness follows once the worker holds all its consumers again.
    wait_for("the worker to be ready again", Duration::from_secs(10), || async {
        (fleet.worker_get(0, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    let id = fleet.call_tool("echo", json!({"query": "after cancel"})).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
}

/// Runs `rabbitmqctl` (the broker's own admin tool) and asserts it succeeded.
fn rabbitmqctl(args: &[&str]) {
    let out = std::process::Command::new("rabbitmqctl").args(args).output().expect("rabbitmqctl on PATH");
    assert!(out.status.success(), "rabbitmqctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_tells_the_truth_when_a_worker_cannot_consume() {
    // A broker user of this test's own that may declare and publish, and read the exchanges (to
    // bind), but not read the queues: it cannot consume.
    let user = BrokerUser::new();
    let no_queue_reads = r".*\.(jobs|dead)$";
    rabbitmqctl(&["set_permissions", "-p", "/", &user.0, ".*", ".*", no_queue_reads]);
    let receiver = Receiver::echo(SECRET).await;
    let options = FleetOptions {
        workers: 0,
        worker_amqp_url: Some(format!("amqp://{}:pw-for-test@127.0.0.1:5672/%2f", user.0)),
        ..FleetOptions::default().env("FLEET_LIVENESS_GRACE", "1")
    };
    let mut fleet = spawn_fleet(options).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let ids: Vec<String> = futures_ids(&fleet, 3).await;
    let w = fleet.spawn_worker_alive().await;
    let body = wait_for("readiness to say the worker is not consuming", Duration::from_secs(10), || async {
        let (status, body) = fleet.worker_get(w, "/readyz").await;
        (status == 503 && body.contains("not consuming")).then_some(body)
    })
    .await;
    assert!(body.contains("not_ready"), "{body}");
    let body = wait_for("the liveness watchdog to fail", Duration::from_secs(10), || async {
        let (status, body) = fleet.worker_get(w, "/healthz").await;
        (status == 503).then_some(body)
    })
    .await;
    assert!(body.contains("3 job(s) wait"), "{body}");
    // Allowed to consume again, the worker subscribes, and health and work come back.
    rabbitmqctl(&["set_permissions", "-p", "/", &user.0, ".*", ".*", ".*"]);
    wait_for("the worker to become ready", Duration::from_secs(20), || async {
        (fleet.worker_get(w, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    assert_eq!(fleet.worker_get(w, "/healthz").await.0, 200);
    for id in &ids {
        fleet.wait_status(id, "succeeded", Duration::from_secs(20)).await;
    }
}

/// A broker user that exists for one test and loses its permissions when it ends, pass or fail.
/// It is not deleted here: RabbitMQ 3.10 closes a deleted user's connections, and deleting one
/// while the test's connections were still closing left the node silent on 5672 (seen twice).
/// `.ci/run` deletes leftover test users at its clean start, when nothing is connected.
struct BrokerUser(String);

impl BrokerUser {
    fn new() -> Self {
        let name = format!("fleet-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        rabbitmqctl(&["add_user", &name, "pw-for-test"]);
        BrokerUser(name)
    }
}

impl Drop for BrokerUser {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl").args(["clear_permissions", &self.0]).output();
    }
}

async fn futures_ids(fleet: &fleet_tests::Fleet, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(fleet.call_tool("echo", json!({"query": format!("{i}")})).await);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_endpoints_fail_over_and_back() {
    let first = Proxy::start("127.0.0.1:5672".parse().unwrap()).await;
    let second = Proxy::start("127.0.0.1:5672".parse().unwrap()).await;
    first.cut();
    let urls = format!("amqp://guest:guest@{}/%2f,amqp://guest:guest@{}/%2f", first.addr, second.addr);
    let receiver = Receiver::echo(SECRET).await;
    let options = FleetOptions { dispatcher_amqp_url: Some(urls), ..FleetOptions::default() };
    let fleet = spawn_fleet(options).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    assert_eq!(first.accepted(), 0);
    assert!(second.accepted() >= 1, "the first endpoint is down, so the second serves");
    let id = fleet.call_tool("echo", json!({"query": "via second"})).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;

    // The first endpoint returns and the second goes away: the dispatcher moves back.
    first.restore();
    second.cut();
    // Until the loss is noticed a publish may still be refused (503); then it goes through the first.
    let id = wait_for("a job accepted through the first endpoint", Duration::from_secs(20), || async {
        let (status, body) =
            fleet.post("/v1/tool-calls", &json!({"tool_name": "echo", "parameters": {"query": "via first"}})).await;
        (status == 202 && first.accepted() >= 1).then(|| body["data"]["execution_id"].as_str().unwrap().to_string())
    })
    .await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
}
