//! Where a retry's lateness comes from: each hop of a failing call split into the worker's
//! bookkeeping (failed answer → retry published), the broker (TTL end → the copy routed back,
//! seen by a tap queue) and the delivery to the next attempt; and a bare delay-queue hop.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use fleet_protocol::envelope::JobKind;
use fleet_tests::schedule::check_waits;
use fleet_tests::{spawn_fleet, wait_for, Fleet, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_retry_timing";
const DELAY_S: f64 = 1.0;

/// Wall-clock milliseconds of an `Instant` taken in this process (tests and broker share a clock).
struct Clock {
    instant: Instant,
    epoch_ms: f64,
}

impl Clock {
    fn new() -> Self {
        let epoch_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64() * 1000.0;
        Clock { instant: Instant::now(), epoch_ms }
    }
    fn ms(&self, at: Instant) -> f64 {
        self.epoch_ms + (at - self.instant).as_secs_f64() * 1000.0
    }
}

/// A queue of the test's own bound like the work queue and its light lane: it receives a copy of
/// every message the jobs exchange routes to `kind`, at the moment the broker routes it.
async fn tap(fleet: &Fleet, kind: JobKind) -> (lapin::Connection, mpsc::UnboundedReceiver<(Instant, Vec<u8>)>) {
    let (conn, channel) = fleet.amqp().await;
    let name = format!("{}.tap", fleet.topology.prefix());
    let options = QueueDeclareOptions { exclusive: true, auto_delete: true, ..Default::default() };
    channel.queue_declare(name.as_str().into(), options, FieldTable::default()).await.unwrap();
    // The kind's key and its light lane's: a tenant's first call takes the lane.
    let keys = std::iter::once(kind.as_str().to_string()).chain(fleet_protocol::topology::light_key(kind));
    for key in keys {
        channel
            .queue_bind(
                name.as_str().into(),
                fleet.topology.jobs_exchange().as_str().into(),
                key.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
    let mut consumer = channel
        .basic_consume(name.as_str().into(), "tap".into(), BasicConsumeOptions::default(), FieldTable::default())
        .await
        .unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(delivery)) = consumer.next().await {
            let _ = tx.send((Instant::now(), delivery.data.clone()));
            let _ = delivery.ack(BasicAckOptions::default()).await;
        }
    });
    (conn, rx)
}

fn span(values: &[f64]) -> String {
    let min = values.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    format!("{min:.0}–{max:.0} ms")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_lateness_splits_into_worker_and_broker_parts() {
    let clock = Clock::new();
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(500)).await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_RETRY_DELAYS", "1,1,1")).await;
    let (_tap_conn, mut tapped) = tap(&fleet, JobKind::ToolCall).await;
    fleet.register_tool("down", &receiver.url("/down"), SECRET).await;
    let id = fleet.call_tool("down", json!({"query": "x"})).await;
    fleet.wait_status(&id, "dead_lettered", Duration::from_secs(30)).await;

    let arrivals: Vec<f64> = receiver.received_for(&id).iter().map(|r| clock.ms(r.at)).collect();
    assert_eq!(arrivals.len(), 4, "four attempts under a three-delay schedule");
    // The tap saw the first publish and then one copy per retry as its TTL ended.
    let mut routed = Vec::new();
    while routed.len() < 4 {
        let (at, body) = tokio::time::timeout(Duration::from_secs(10), tapped.recv()).await.unwrap().unwrap();
        let envelope: Value = serde_json::from_slice(&body).unwrap();
        routed.push((clock.ms(at), envelope["not_before_ms"].as_f64()));
    }
    let (mut worker, mut broker, mut delivery, mut total) = (vec![], vec![], vec![], vec![]);
    for hop in 1..4 {
        let due = routed[hop].1.expect("a retry carries its due time");
        let published = due - DELAY_S * 1000.0;
        worker.push(published - arrivals[hop - 1]);
        broker.push(routed[hop].0 - due);
        delivery.push(arrivals[hop] - routed[hop].0);
        total.push(arrivals[hop] - arrivals[hop - 1] - DELAY_S * 1000.0);
    }
    println!(
        "retry lateness per hop: worker bookkeeping {}, broker (TTL end → routed) {}, routed → next attempt {}, total {}",
        span(&worker),
        span(&broker),
        span(&delivery),
        span(&total)
    );
    // Each part is milliseconds on a quiet machine; a second would mean a part sleeps or polls.
    // The tap's clock is when this process's tap task saw the copy: on a busy machine that can
    // lag the receiver's handler by tens of milliseconds, which moves time from "delivery"
    // (even below zero) to "broker"; their sum (due → next attempt) carries no such lag.
    let due_to_attempt: Vec<f64> = broker.iter().zip(&delivery).map(|(b, d)| b + d).collect();
    for (what, parts, low) in [
        ("worker", &worker, -20.0),
        ("broker", &broker, -20.0),
        ("delivery", &delivery, -250.0),
        ("due → next attempt", &due_to_attempt, -20.0),
    ] {
        assert!(parts.iter().all(|ms| (low..1000.0).contains(ms)), "{what} share out of range: {parts:?}");
    }
    let waits: Vec<f64> = arrivals.windows(2).map(|w| (w[1] - w[0]) / 1000.0).collect();
    check_waits(&waits, &[DELAY_S; 3]).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_delay_queue_hop_is_late_by_milliseconds() {
    let clock = Clock::new();
    let fleet =
        spawn_fleet(FleetOptions { workers: 0, ..FleetOptions::default().env("FLEET_RETRY_DELAYS", "1") }).await;
    let (_tap_conn, mut tapped) = tap(&fleet, JobKind::Webhook).await;
    // The dispatcher declared the topology; publish straight into the 1 s delay queue.
    wait_for("the topology", Duration::from_secs(10), || async {
        (fleet.queue_depth(&fleet.topology.park_queue(JobKind::Webhook, Duration::from_secs(1))).await == 0)
            .then_some(())
    })
    .await;
    let (conn, channel) = fleet.amqp().await;
    channel.confirm_select(Default::default()).await.unwrap();
    let mut lateness = Vec::new();
    // Hop 0 warms the queue up and is not counted.
    for i in 0..6 {
        let sent = Instant::now();
        channel
            .basic_publish(
                "".into(),
                fleet.topology.park_queue(JobKind::Webhook, Duration::from_secs(1)).as_str().into(),
                BasicPublishOptions::default(),
                format!("hop {i}").as_bytes(),
                BasicProperties::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        let (at, _) = tokio::time::timeout(Duration::from_secs(10), tapped.recv()).await.unwrap().unwrap();
        if i > 0 {
            lateness.push(clock.ms(at) - clock.ms(sent) - DELAY_S * 1000.0);
        }
    }
    let _ = conn.close(200, "".into()).await;
    println!("bare delay-queue hop past its 1 s TTL: {}", span(&lateness));
    // Milliseconds as a rule; one hop of five came 1,013 ms late once with the other core busy
    // (the broker's expiry timer under load), so one may be late by up to 2 s, not more.
    let mut sorted = lateness.clone();
    sorted.sort_by(f64::total_cmp);
    assert!((-20.0..100.0).contains(&sorted[2]), "median hop lateness {lateness:?}");
    assert!(sorted[3] < 1000.0 && sorted[4] < 2000.0, "hop lateness {lateness:?}");
    assert!(sorted[0] >= -20.0, "a hop came before its TTL: {lateness:?}");
}
