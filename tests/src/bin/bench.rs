//! `fleet-bench` (`make bench`): the fleet against the raw broker, measured in one run on the same
//! quorum queue type with persistence, publisher confirms and manual acks.
//!
//! 1. raw broker: confirmed publishes of N job-sized messages (pipelined), then a consumer that
//!    acks them with the worker's prefetch and does no work: the ceiling;
//! 2. the fleet: N `POST /v1/tool-calls` from concurrent clients, then workers draining them with
//!    a claim in Redis, a signed POST to a fast local receiver, the result stored and the ack;
//! 3. latency: enqueue → callback received, at half the fleet's measured drain rate.
//!
//! Settings: FLEET_BENCH_JOBS (5000), FLEET_BENCH_WORKERS (2), FLEET_BENCH_CLIENTS (32),
//! FLEET_BENCH_CONCURRENCY (32, per worker), FLEET_BENCH_LATENCY_JOBS (1000).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::State;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde_json::{json, Value};

use fleet_tests::{amqp_url, free_port, redis_url};

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[derive(Default)]
struct Arrivals {
    at: Mutex<HashMap<String, Instant>>,
}

async fn receive(State(arrivals): State<Arc<Arrivals>>, body: Bytes) -> &'static str {
    if let Ok(v) = serde_json::from_slice::<Value>(&body) {
        if let Some(id) = v["execution_id"].as_str() {
            arrivals.at.lock().unwrap().entry(id.to_string()).or_insert_with(Instant::now);
        }
    }
    r#"{"result":{"ok":true}}"#
}

fn sibling_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("bench path");
    exe.parent().expect("bin dir").join(name)
}

struct Procs(Vec<Child>);
impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let jobs = setting("FLEET_BENCH_JOBS", 5000);
    let workers = setting("FLEET_BENCH_WORKERS", 2);
    let clients = setting("FLEET_BENCH_CLIENTS", 32);
    let concurrency = setting("FLEET_BENCH_CONCURRENCY", 32);
    let latency_jobs = setting("FLEET_BENCH_LATENCY_JOBS", 1000);
    let id = format!("bench{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    println!("fleet-bench: {jobs} jobs, {workers} worker(s) × concurrency {concurrency}, {clients} API clients");

    // ---- 1. raw broker ceiling ----
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default()).await?;
    let channel = conn.create_channel().await?;
    let raw_queue = format!("{id}.raw");
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), AMQPValue::LongString(LongString::from(b"quorum".to_vec())));
    channel
        .queue_declare(raw_queue.as_str().into(), QueueDeclareOptions { durable: true, ..Default::default() }, args)
        .await?;
    channel.confirm_select(Default::default()).await?;
    let payload = json!({"v":1,"execution_id":"exec_0123456789abcdef0123456789abcdef","attempt":1,"enqueued_at_ms":1,
        "kind":"tool_call","tool_name":"bench","parameters":{"query":"benchmark payload"},"room_id":"room_1","assistant_id":"asst_1"})
    .to_string();
    let started = Instant::now();
    let mut pending = futures::stream::FuturesUnordered::new();
    for _ in 0..jobs {
        let confirm = channel
            .basic_publish(
                "".into(),
                raw_queue.as_str().into(),
                BasicPublishOptions::default(),
                payload.as_bytes(),
                BasicProperties::default().with_delivery_mode(2).with_content_type("application/json".into()),
            )
            .await?;
        pending.push(confirm);
        if pending.len() >= clients {
            pending.next().await.context("confirm")??;
        }
    }
    while let Some(c) = pending.next().await {
        c?;
    }
    let raw_publish_rate = jobs as f64 / started.elapsed().as_secs_f64();

    let consume_channel = conn.create_channel().await?;
    consume_channel.basic_qos((concurrency * workers) as u16, BasicQosOptions::default()).await?;
    let mut consumer = consume_channel
        .basic_consume(raw_queue.as_str().into(), "bench".into(), BasicConsumeOptions::default(), FieldTable::default())
        .await?;
    let started = Instant::now();
    for _ in 0..jobs {
        let delivery = consumer.next().await.context("raw consumer ended")??;
        delivery.ack(BasicAckOptions::default()).await?;
    }
    let raw_drain_rate = jobs as f64 / started.elapsed().as_secs_f64();
    channel.queue_delete(raw_queue.as_str().into(), QueueDeleteOptions::default()).await?;

    // ---- 2. the fleet ----
    let arrivals = Arc::new(Arrivals::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let receiver_addr = listener.local_addr()?;
    let app = axum::Router::new().fallback(receive).with_state(arrivals.clone());
    let receiver = tokio::spawn(async move { axum::serve(listener, app).await });

    let token = format!("bench-token-{id}");
    let port = free_port();
    let api = format!("http://127.0.0.1:{port}");
    let env = |cmd: &mut Command| {
        cmd.env("FLEET_AMQP_URL", amqp_url())
            .env("FLEET_REDIS_URL", redis_url())
            .env("FLEET_TOPOLOGY_PREFIX", format!("fleet-{id}"))
            .env("FLEET_REDIS_KEY_PREFIX", format!("{id}:"))
            .env("FLEET_API_TOKENS", &token)
            .env("FLEET_SECRETS_KEY", "6b6579206f6620746865207465737420666c6565742c2033322062797465732e")
            .env("FLEET_ALLOW_PRIVATE_CALLBACKS", "true")
            .env("FLEET_WORKER_CONCURRENCY", concurrency.to_string())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
    };
    let mut procs = Procs(vec![]);
    let mut cmd = Command::new(sibling_binary("dispatcher"));
    env(&mut cmd);
    cmd.env("FLEET_HTTP_ADDR", format!("127.0.0.1:{port}"));
    procs.0.push(cmd.spawn().context("start dispatcher (build with cargo build --release --workspace --bins)")?);
    let http = reqwest::Client::builder().pool_max_idle_per_host(clients).build()?;
    wait_ready(&http, &format!("{api}/readyz")).await?;
    let tool = json!({"description":"bench","parameters":{"type":"object"},"callback_url": format!("http://{receiver_addr}/bench"),
        "callback_secret":"bench_secret_0123456789"});
    let r = http.put(format!("{api}/v1/tools/bench")).bearer_auth(&token).json(&tool).send().await?;
    anyhow::ensure!(r.status().is_success(), "register tool: {}", r.status());

    let enqueue = |n: usize| {
        let (http, api, token) = (http.clone(), api.clone(), token.clone());
        async move {
            let body = json!({"tool_name":"bench","parameters":{"query":"benchmark payload","n":n},"room_id":"room_1","assistant_id":"asst_1"});
            let sent = Instant::now();
            let resp = http.post(format!("{api}/v1/tool-calls")).bearer_auth(&token).json(&body).send().await?;
            anyhow::ensure!(resp.status().as_u16() == 202, "enqueue answered {}", resp.status());
            let v: Value = resp.json().await?;
            Ok::<_, anyhow::Error>((v["data"]["execution_id"].as_str().unwrap_or_default().to_string(), sent))
        }
    };
    let started = Instant::now();
    let results: Vec<_> = futures::stream::iter(0..jobs).map(enqueue).buffer_unordered(clients).collect().await;
    let enqueue_rate = jobs as f64 / started.elapsed().as_secs_f64();
    for r in &results {
        if let Err(e) = r {
            anyhow::bail!("enqueue failed: {e}");
        }
    }

    let started = Instant::now();
    for _ in 0..workers {
        let mut cmd = Command::new(sibling_binary("worker"));
        env(&mut cmd);
        cmd.env("FLEET_WORKER_HTTP_ADDR", format!("127.0.0.1:{}", free_port()));
        procs.0.push(cmd.spawn().context("start worker")?);
    }
    wait_until(Duration::from_secs(600), || arrivals.at.lock().unwrap().len() >= jobs).await?;
    let drain_elapsed = started.elapsed();
    let fleet_drain_rate = jobs as f64 / drain_elapsed.as_secs_f64();

    // ---- 3. latency at half the drain rate ----
    let rate = (fleet_drain_rate / 2.0).max(1.0);
    let interval = Duration::from_secs_f64(1.0 / rate);
    let mut sent: Vec<(String, Instant)> = Vec::with_capacity(latency_jobs);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut inflight = futures::stream::FuturesUnordered::new();
    for n in 0..latency_jobs {
        tick.tick().await;
        inflight.push(enqueue(jobs + n));
        while let Some(Some(done)) = futures::FutureExt::now_or_never(inflight.next()) {
            sent.push(done?);
        }
    }
    while let Some(done) = inflight.next().await {
        sent.push(done?);
    }
    wait_until(Duration::from_secs(120), || {
        let at = arrivals.at.lock().unwrap();
        sent.iter().all(|(id, _)| at.contains_key(id))
    })
    .await?;
    let mut latencies: Vec<f64> = {
        let at = arrivals.at.lock().unwrap();
        sent.iter().map(|(id, t)| (at[id].duration_since(*t)).as_secs_f64() * 1000.0).collect()
    };
    latencies.sort_by(|a, b| a.partial_cmp(b).unwrap());

    drop(procs);
    receiver.abort();
    cleanup(&id, &conn).await;

    println!();
    println!("{:<52} {:>12} {:>14}", "figure", "value", "ratio");
    println!("{:<52} {:>12.0} {:>14}", "raw broker: drain, consume+ack (msg/s)", raw_drain_rate, "ceiling");
    println!(
        "{:<52} {:>12.0} {:>13.0}%",
        "fleet: drain, claim+signed POST+result+ack (jobs/s)",
        fleet_drain_rate,
        100.0 * fleet_drain_rate / raw_drain_rate
    );
    println!("{:<52} {:>12.0} {:>14}", "raw broker: confirmed publish (msg/s)", raw_publish_rate, "ceiling");
    println!(
        "{:<52} {:>12.0} {:>13.0}%",
        "fleet: POST /v1/tool-calls, 202 after confirm (jobs/s)",
        enqueue_rate,
        100.0 * enqueue_rate / raw_publish_rate
    );
    println!(
        "{:<52} {:>12.1}",
        format!("latency enqueue→callback p50 (ms) at {rate:.0} jobs/s"),
        percentile(&latencies, 0.50)
    );
    println!(
        "{:<52} {:>12.1}",
        format!("latency enqueue→callback p99 (ms) at {rate:.0} jobs/s"),
        percentile(&latencies, 0.99)
    );
    Ok(())
}

async fn wait_ready(http: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if http.get(url).send().await.map(|r| r.status().is_success()).unwrap_or(false) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("{url} never became ready")
}

async fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !done() {
        anyhow::ensure!(Instant::now() < deadline, "timed out after {timeout:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

async fn cleanup(id: &str, conn: &Connection) {
    let topology =
        fleet_protocol::topology::Topology::new(format!("fleet-{id}"), fleet_protocol::retry::default_delays());
    if let Ok(ch) = conn.create_channel().await {
        for q in topology.queues() {
            let _ = ch.queue_delete(q.name.as_str().into(), QueueDeleteOptions::default()).await;
        }
        for e in topology.exchanges() {
            let _ = ch.exchange_delete(e.name.as_str().into(), Default::default()).await;
        }
    }
    if let Ok(client) = redis::Client::open(redis_url()) {
        if let Ok(mut con) = client.get_multiplexed_async_connection().await {
            let keys: Vec<String> =
                redis::cmd("KEYS").arg(format!("{id}:*")).query_async(&mut con).await.unwrap_or_default();
            for chunk in keys.chunks(1000) {
                let _: Result<(), _> = redis::cmd("DEL").arg(chunk).query_async(&mut con).await;
            }
        }
    }
}
