//! `fleet-bench` (`make bench`): the fleet against the raw broker, measured in one run on the same
//! quorum queue type with persistence, publisher confirms and manual acks, plus memory, scaling and
//! per-turn overhead. Prints one table: figure, value, target, ratio.
//!
//! Settings: FLEET_BENCH_JOBS (5000), FLEET_BENCH_WORKERS (2), FLEET_BENCH_CLIENTS (32),
//! FLEET_BENCH_CONCURRENCY (32), FLEET_BENCH_LATENCY_JOBS (1000), FLEET_BENCH_TURNS (200).
//!
//! `make bench-peers` (FLEET_BENCH_PEERS=1) measures only the drain, the fleet's beside Celery's
//! (`scripts/bench-peers/celery_peer.py`: the same signed-callback job, prefork × 4, `acks_late`,
//! publisher confirms) on the same broker, Redis and receiver, and prints their ratio.

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

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::{amqp_url, free_port, redis_url};

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A tool owner that answers after `delay`, recording when each execution first arrived.
struct Receiver {
    addr: std::net::SocketAddr,
    arrivals: Arc<Mutex<HashMap<String, Instant>>>,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    _task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct ReceiverState {
    arrivals: Arc<Mutex<HashMap<String, Instant>>>,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    delay: Duration,
}

async fn receive(State(s): State<ReceiverState>, body: Bytes) -> &'static str {
    use std::sync::atomic::Ordering;
    if let Ok(v) = serde_json::from_slice::<Value>(&body) {
        if let Some(id) = v["execution_id"].as_str() {
            s.arrivals.lock().unwrap().entry(id.to_string()).or_insert_with(Instant::now);
        }
    }
    if !s.delay.is_zero() {
        s.in_flight.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(s.delay).await;
        s.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
    r#"{"result":{"ok":true}}"#
}

impl Receiver {
    async fn start(delay: Duration) -> Self {
        let state = ReceiverState { arrivals: Default::default(), in_flight: Default::default(), delay };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().fallback(receive).with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { addr, arrivals: state.arrivals, in_flight: state.in_flight, _task: task }
    }
    fn count(&self) -> usize {
        self.arrivals.lock().unwrap().len()
    }
}

fn sibling_binary(name: &str) -> PathBuf {
    std::env::current_exe().expect("bench path").parent().expect("bin dir").join(name)
}

/// A dispatcher and workers (release binaries) with their own topology and key prefix.
struct BenchFleet {
    id: String,
    api: String,
    token: String,
    http: reqwest::Client,
    env: Vec<(String, String)>,
    dispatcher: Child,
    workers: Vec<Child>,
}

impl BenchFleet {
    async fn start(env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let id = format!("bench{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let port = free_port();
        let mut fleet = BenchFleet {
            api: format!("http://127.0.0.1:{port}"),
            token: format!("bench-token-{id}"),
            http: reqwest::Client::builder().pool_max_idle_per_host(64).build()?,
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            dispatcher: Command::new("true").spawn()?,
            workers: vec![],
            id,
        };
        let mut cmd = fleet.command("dispatcher");
        cmd.env("FLEET_HTTP_ADDR", format!("127.0.0.1:{port}"));
        fleet.dispatcher = cmd.spawn().context("start dispatcher (cargo build --release --workspace --bins)")?;
        wait_ready(&fleet.http, &format!("{}/readyz", fleet.api)).await?;
        Ok(fleet)
    }

    fn command(&self, bin: &str) -> Command {
        let mut cmd = Command::new(sibling_binary(bin));
        cmd.env("FLEET_AMQP_URL", amqp_url())
            .env("FLEET_REDIS_URL", redis_url())
            .env("FLEET_TOPOLOGY_PREFIX", format!("fleet-{}", self.id))
            .env("FLEET_REDIS_KEY_PREFIX", format!("{}:", self.id))
            .env("FLEET_API_TOKENS", &self.token)
            .env("FLEET_SECRETS_KEY", "6b6579206f6620746865207465737420666c6565742c2033322062797465732e")
            .env("FLEET_ALLOW_PRIVATE_CALLBACKS", "true")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// The processes a phase's CPU is charged to: the services, the bench and the dispatcher.
    fn parts(&self) -> Vec<(&'static str, Vec<u32>)> {
        let mut parts = services();
        parts.push(("dispatcher", vec![self.dispatcher.id()]));
        parts
    }

    async fn add_worker(&mut self) -> anyhow::Result<u32> {
        let port = free_port();
        let mut cmd = self.command("worker");
        cmd.env("FLEET_WORKER_HTTP_ADDR", format!("127.0.0.1:{port}"));
        let child = cmd.spawn().context("start worker")?;
        let pid = child.id();
        self.workers.push(child);
        wait_ready(&self.http, &format!("http://127.0.0.1:{port}/readyz")).await?;
        Ok(pid)
    }

    async fn register(&self, url: &str) -> anyhow::Result<()> {
        let tool = json!({"description":"bench","parameters":{"type":"object"},"callback_url": url,"callback_secret":"bench_secret_0123456789"});
        let r =
            self.http.put(format!("{}/v1/tools/bench", self.api)).bearer_auth(&self.token).json(&tool).send().await?;
        anyhow::ensure!(r.status().is_success(), "register tool: {}", r.status());
        Ok(())
    }

    async fn enqueue(&self, n: usize) -> anyhow::Result<(String, Instant)> {
        let body = json!({"tool_name":"bench","parameters":{"query":"benchmark payload","n":n},"room_id":"room_1","assistant_id":"asst_1"});
        let sent = Instant::now();
        let resp =
            self.http.post(format!("{}/v1/tool-calls", self.api)).bearer_auth(&self.token).json(&body).send().await?;
        anyhow::ensure!(resp.status().as_u16() == 202, "enqueue answered {}", resp.status());
        let v: Value = resp.json().await?;
        Ok((v["data"]["execution_id"].as_str().unwrap_or_default().to_string(), sent))
    }

    async fn enqueue_many(&self, range: std::ops::Range<usize>, clients: usize) -> anyhow::Result<f64> {
        let n = range.len();
        let started = Instant::now();
        let results: Vec<_> =
            futures::stream::iter(range).map(|i| self.enqueue(i)).buffer_unordered(clients).collect().await;
        for r in results {
            r?;
        }
        Ok(n as f64 / started.elapsed().as_secs_f64())
    }

    async fn stop(mut self, conn: &Connection) {
        for c in self.workers.iter_mut().chain(std::iter::once(&mut self.dispatcher)) {
            let _ = c.kill();
            let _ = c.wait();
        }
        cleanup(&self.id, conn).await;
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmRSS:").map(|v| v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0))
            })
        })
        .unwrap_or(0)
}

/// The pid listening on a local TCP port (`ss`), so a phase's CPU can be charged to the machine's
/// broker and Redis.
fn pid_listening_on(port: u16) -> Option<u32> {
    let out = Command::new("ss").args(["-Hltnp", &format!("sport = :{port}")]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let at = text.find("pid=")? + 4;
    text[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// CPU time (user + system) a process has used so far, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("").split_whitespace().collect();
    let ticks: u64 = fields.get(11..13).map(|f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum()).unwrap_or(0);
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Where a phase's CPU went: each part's CPU seconds between `start` and `per_job`, divided by the
/// jobs the phase moved. On a machine whose cores are saturated this is what bounds the rate: the
/// rate cannot pass cores / (sum of the parts' CPU per job).
struct CpuAccount {
    parts: Vec<(&'static str, Vec<u32>)>,
    start: Vec<f64>,
    started: Instant,
}

impl CpuAccount {
    fn start(parts: Vec<(&'static str, Vec<u32>)>) -> Self {
        let start = parts.iter().map(|(_, pids)| pids.iter().map(|p| cpu_seconds(*p)).sum()).collect();
        CpuAccount { parts, start, started: Instant::now() }
    }

    /// A process started during the phase, charged from its birth.
    fn add(&mut self, part: &'static str, pid: u32) {
        match self.parts.iter_mut().position(|(name, _)| *name == part) {
            Some(i) => self.parts[i].1.push(pid),
            None => {
                self.parts.push((part, vec![pid]));
                self.start.push(0.0);
            }
        }
    }

    /// Each part's CPU per job in microseconds, and the machine's share of busy cores.
    fn per_job(&self, jobs: usize) -> (Vec<(&'static str, f64)>, f64) {
        let wall = self.started.elapsed().as_secs_f64();
        let mut busy = 0.0;
        let parts = self
            .parts
            .iter()
            .zip(&self.start)
            .map(|((name, pids), before)| {
                let used = pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - before;
                busy += used;
                (*name, used * 1e6 / jobs as f64)
            })
            .collect();
        (parts, busy / wall)
    }
}

/// The machine's broker and Redis, and this process (the raw clients, or the receivers and API
/// clients of a fleet phase).
fn services() -> Vec<(&'static str, Vec<u32>)> {
    let mut parts = vec![];
    for (name, port) in [("rabbitmq", 5672), ("redis", 6379)] {
        parts.push((name, pid_listening_on(port).into_iter().collect()));
    }
    parts.push(("bench", vec![std::process::id()]));
    parts
}

fn print_account(title: &str, (parts, cores): &(Vec<(&'static str, f64)>, f64)) {
    let total: f64 = parts.iter().map(|(_, us)| us).sum();
    let each: Vec<String> = parts.iter().map(|(name, us)| format!("{name} {us:.0}")).collect();
    println!("cpu µs per job, {title}: {} = {total:.0} (cores busy {cores:.2})", each.join(" + "));
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
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
    let turns = setting("FLEET_BENCH_TURNS", 200);
    println!("fleet-bench: {jobs} jobs, {workers} worker(s) × concurrency {concurrency}, {clients} API clients");
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default()).await?;
    if std::env::var("FLEET_BENCH_PEERS").is_ok_and(|v| v == "1") {
        return peers(&conn, jobs, workers, &concurrency.to_string(), clients).await;
    }

    // ---- 1. raw broker ceiling ----
    let (raw_publish_rate, raw_drain_rate) = raw_broker(&conn, jobs, clients, concurrency * workers).await?;

    // ---- 2. fleet throughput and 3. latency ----
    let conc = concurrency.to_string();
    let receiver = Receiver::start(Duration::ZERO).await;
    let (fleet, enqueue_rate, fleet_drain_rate) = fleet_drain(&receiver, jobs, workers, &conc, clients).await?;

    // The maximum sustained rate: producers and workers running together, end to end.
    let sustained_jobs = jobs / 2;
    let started = Instant::now();
    fleet.enqueue_many(jobs..jobs + sustained_jobs, clients).await?;
    wait_until(Duration::from_secs(600), || receiver.count() >= jobs + sustained_jobs).await?;
    let sustained_rate = sustained_jobs as f64 / started.elapsed().as_secs_f64();
    let base = jobs + sustained_jobs;
    let rate = (sustained_rate / 2.0).max(1.0);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent = Vec::with_capacity(latency_jobs);
    let mut inflight = futures::stream::FuturesUnordered::new();
    for n in 0..latency_jobs {
        tick.tick().await;
        inflight.push(fleet.enqueue(base + n));
        while let Some(Some(done)) = futures::FutureExt::now_or_never(inflight.next()) {
            sent.push(done?);
        }
    }
    while let Some(done) = inflight.next().await {
        sent.push(done?);
    }
    drop(inflight);
    wait_until(Duration::from_secs(120), || {
        let at = receiver.arrivals.lock().unwrap();
        sent.iter().all(|(id, _)| at.contains_key(id))
    })
    .await?;
    let mut latencies: Vec<f64> = {
        let at = receiver.arrivals.lock().unwrap();
        sent.iter().map(|(id, t)| at[id].duration_since(*t).as_secs_f64() * 1000.0).collect()
    };
    latencies.sort_by(|a, b| a.partial_cmp(b).unwrap());
    fleet.stop(&conn).await;

    // ---- 4. memory: one worker holding 1000 callbacks to a slow receiver ----
    let slow = Receiver::start(Duration::from_secs(3)).await;
    let mut fleet = BenchFleet::start(&[("FLEET_WORKER_CONCURRENCY", "1000")]).await?;
    fleet.register(&format!("http://{}/slow", slow.addr)).await?;
    let pid = fleet.add_worker().await?;
    // Warm the client's code paths, then take the idle baseline.
    fleet.enqueue(0).await?;
    wait_until(Duration::from_secs(30), || slow.count() >= 1).await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let baseline = rss_kib(pid);
    fleet.enqueue_many(1..1001, clients).await?;
    wait_until(Duration::from_secs(60), || slow.in_flight.load(std::sync::atomic::Ordering::SeqCst) >= 1000).await?;
    let peak = rss_kib(pid);
    wait_until(Duration::from_secs(60), || {
        slow.count() >= 1001 && slow.in_flight.load(std::sync::atomic::Ordering::SeqCst) == 0
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = rss_kib(pid);
    fleet.stop(&conn).await;

    // ---- 5. scaling: 1 vs 4 workers against a 50 ms receiver ----
    let scale_jobs = 800;
    let mut rates = Vec::new();
    for n in [1usize, 4] {
        let r = Receiver::start(Duration::from_millis(50)).await;
        let mut fleet = BenchFleet::start(&[("FLEET_WORKER_CONCURRENCY", "8")]).await?;
        fleet.register(&format!("http://{}/scale", r.addr)).await?;
        fleet.enqueue_many(0..scale_jobs, clients).await?;
        let started = Instant::now();
        for _ in 0..n {
            fleet.add_worker().await?;
        }
        wait_until(Duration::from_secs(300), || r.count() >= scale_jobs).await?;
        rates.push(scale_jobs as f64 / started.elapsed().as_secs_f64());
        fleet.stop(&conn).await;
    }

    // ---- 6. turns: the fleet's own time per turn, beside the model's ----
    let llm =
        MockLlm::start(|_, _| LlmReply::Text { tokens: vec!["Hi".into(), " there".into()], delay: Duration::ZERO })
            .await;
    let base = llm.base_url();
    let mut fleet = BenchFleet::start(&[("FLEET_LLM_BASE_URL", &base)]).await?;
    fleet.add_worker().await?;
    let mut overheads = Vec::new();
    for n in 0..turns {
        let body = json!({"session_id": format!("bench_{n}"), "assistant": {"id": "a", "model_config": {"model": "m"}}, "messages": [{"role": "user", "content": "hi"}]});
        let t0 = Instant::now();
        let resp: Value = fleet
            .http
            .post(format!("{}/v1/turns", fleet.api))
            .bearer_auth(&fleet.token)
            .json(&body)
            .send()
            .await?
            .json()
            .await?;
        let id = resp["data"]["execution_id"].as_str().context("turn id")?.to_string();
        loop {
            let v: Value = fleet
                .http
                .get(format!("{}/v1/executions/{id}", fleet.api))
                .bearer_auth(&fleet.token)
                .send()
                .await?
                .json()
                .await?;
            if v["data"]["status"] == "succeeded" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let total = t0.elapsed();
        let model = llm.requests().last().and_then(|r| r.ended.map(|e| e - r.started)).unwrap_or_default();
        overheads.push((total.saturating_sub(model)).as_secs_f64() * 1000.0);
    }
    fleet.stop(&conn).await;

    let _ = conn.close(200, "".into()).await;
    let row = |figure: &str, value: String, target: &str, ratio: String| {
        println!("{figure:<58} {value:>12} {target:>14} {ratio:>10}")
    };
    println!();
    row("figure", "value".into(), "target", "ratio".into());
    row("raw broker: drain, consume+ack (msg/s)", format!("{raw_drain_rate:.0}"), "ceiling", "".into());
    row(
        "fleet: drain, claim+signed POST+result+ack (jobs/s)",
        format!("{fleet_drain_rate:.0}"),
        ">= 60 %",
        format!("{:.0} %", 100.0 * fleet_drain_rate / raw_drain_rate),
    );
    row("raw broker: confirmed publish (msg/s)", format!("{raw_publish_rate:.0}"), "ceiling", "".into());
    row(
        "fleet: POST /v1/tool-calls, 202 after confirm (jobs/s)",
        format!("{enqueue_rate:.0}"),
        ">= 50 %",
        format!("{:.0} %", 100.0 * enqueue_rate / raw_publish_rate),
    );
    row("fleet: sustained, enqueue and drain together (jobs/s)", format!("{sustained_rate:.0}"), "", "".into());
    row(
        &format!("latency enqueue→callback p50 (ms) at {rate:.0} jobs/s"),
        format!("{:.1}", percentile(&latencies, 0.50)),
        "",
        "".into(),
    );
    row(
        &format!("latency enqueue→callback p99 (ms) at {rate:.0} jobs/s"),
        format!("{:.1}", percentile(&latencies, 0.99)),
        "<= 15 ms",
        "".into(),
    );
    row("worker RSS: idle (MiB)", format!("{:.1}", baseline as f64 / 1024.0), "", "".into());
    row("worker RSS: 1000 callbacks in flight (MiB)", format!("{:.1}", peak as f64 / 1024.0), "< 64 MiB", "".into());
    row(
        "worker RSS: after they finished (MiB)",
        format!("{:.1}", after as f64 / 1024.0),
        "~ idle",
        format!("{:.2}×", after as f64 / baseline.max(1) as f64),
    );
    row("scaling, 50 ms receiver: 1 worker × 8 (jobs/s)", format!("{:.0}", rates[0]), "", "".into());
    row(
        "scaling, 50 ms receiver: 4 workers × 8 (jobs/s)",
        format!("{:.0}", rates[1]),
        ">= 3.5×",
        format!("{:.2}×", rates[1] / rates[0]),
    );
    row("turn: fleet overhead per turn, median (ms)", format!("{:.1}", median(overheads)), "<= 5 ms", "".into());
    Ok(())
}

/// A fleet of `workers` started on `jobs` jobs enqueued beforehand (to `receiver`): the fleet, the
/// enqueue rate and the drain rate (from starting the workers to the last job's arrival).
async fn fleet_drain(
    receiver: &Receiver,
    jobs: usize,
    workers: usize,
    concurrency: &str,
    clients: usize,
) -> anyhow::Result<(BenchFleet, f64, f64)> {
    let mut fleet = BenchFleet::start(&[("FLEET_WORKER_CONCURRENCY", concurrency)]).await?;
    fleet.register(&format!("http://{}/bench", receiver.addr)).await?;
    let before = receiver.count();
    let account = CpuAccount::start(fleet.parts());
    let enqueue_rate = fleet.enqueue_many(0..jobs, clients).await?;
    print_account("fleet enqueue", &account.per_job(jobs));
    let started = Instant::now();
    let mut account = CpuAccount::start(fleet.parts());
    for _ in 0..workers {
        // A worker's CPU counts from its birth: its start-up (tens of ms) is charged to the drain.
        account.add("workers", fleet.add_worker().await?);
    }
    wait_until(Duration::from_secs(600), || receiver.count() >= before + jobs).await?;
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    print_account("fleet drain", &account.per_job(jobs));
    Ok((fleet, enqueue_rate, rate))
}

/// `make bench-peers`: the fleet's drain and Celery's, the same job to the same receiver.
async fn peers(
    conn: &Connection,
    jobs: usize,
    workers: usize,
    concurrency: &str,
    clients: usize,
) -> anyhow::Result<()> {
    let receiver = Receiver::start(Duration::ZERO).await;
    let (fleet, _, fleet_rate) = fleet_drain(&receiver, jobs, workers, concurrency, clients).await?;
    fleet.stop(conn).await;
    let celery_rate = celery_drain(conn, &receiver, jobs).await?;
    println!("{:<52} {:>10}", "fleet drain (jobs/s)", format!("{fleet_rate:.0}"));
    println!("{:<52} {:>10}", "Celery 5.7 drain, prefork × 4, acks_late (jobs/s)", format!("{celery_rate:.0}"));
    println!("{:<52} {:>10}   target >= 10×", "fleet / Celery", format!("{:.1}×", fleet_rate / celery_rate));
    Ok(())
}

/// Publishes `jobs` Celery tasks (confirmed), then starts a Celery worker and times its drain.
async fn celery_drain(conn: &Connection, receiver: &Receiver, jobs: usize) -> anyhow::Result<f64> {
    let venv = std::env::var("FLEET_CELERY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/fleet-celery"));
    let dir = std::env::var("FLEET_BENCH_PEER_DIR").unwrap_or_else(|_| "scripts/bench-peers".into());
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let queue = format!("bench-celery-{run}");
    let peer = |program: PathBuf| {
        let mut cmd = Command::new(program);
        cmd.current_dir(&dir)
            .env("PEER_QUEUE", &queue)
            .env("PEER_KEY_PREFIX", format!("{queue}:"))
            .env("PEER_RECEIVER_URL", format!("http://{}/bench", receiver.addr))
            .env("PEER_AMQP_URL", amqp_url())
            .env("PEER_REDIS_URL", redis_url())
            .stdin(Stdio::null());
        cmd
    };
    let status = peer(venv.join("bin/python")).args(["celery_peer.py", "publish", &jobs.to_string(), &run]).status();
    anyhow::ensure!(status?.success(), "publishing the Celery tasks failed (make bench-peers installs Celery)");
    let before = receiver.count();
    let started = Instant::now();
    let mut worker = peer(venv.join("bin/celery"))
        .args(["-A", "celery_peer", "worker", "-P", "prefork", "-c", "4", "-Q", &queue, "-l", "WARNING"])
        .args(["--without-gossip", "--without-mingle", "--without-heartbeat"])
        .stdout(Stdio::null())
        .spawn()
        .context("start the Celery worker")?;
    let drained = wait_until(Duration::from_secs(900), || receiver.count() >= before + jobs).await;
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    let _ = worker.kill();
    let _ = worker.wait();
    if let Ok(ch) = conn.create_channel().await {
        let _ = ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await;
        let _ = ch.exchange_delete(queue.as_str().into(), Default::default()).await;
        // Celery's worker declares its native delayed-delivery topology on quorum queues (which
        // cannot be deleted "if empty"; nothing here delays a task, so they are empty).
        for level in 0..28 {
            let name = format!("celery_delayed_{level}");
            let _ = ch.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await;
            let _ = ch.exchange_delete(name.as_str().into(), Default::default()).await;
        }
        for exchange in ["celery_delayed_delivery", "celery.pidbox"] {
            let _ = ch.exchange_delete(exchange.into(), Default::default()).await;
        }
    }
    delete_keys(&format!("{queue}:*")).await;
    drained.map(|()| rate)
}

async fn raw_broker(conn: &Connection, jobs: usize, window: usize, prefetch: usize) -> anyhow::Result<(f64, f64)> {
    let channel = conn.create_channel().await?;
    let raw_queue = format!("bench-raw-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
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
    let account = CpuAccount::start(services());
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
        if pending.len() >= window {
            pending.next().await.context("confirm")??;
        }
    }
    while let Some(c) = pending.next().await {
        c?;
    }
    let publish_rate = jobs as f64 / started.elapsed().as_secs_f64();
    print_account("raw confirmed publish", &account.per_job(jobs));
    let consume = conn.create_channel().await?;
    consume.basic_qos(prefetch as u16, BasicQosOptions::default()).await?;
    let mut consumer = consume
        .basic_consume(raw_queue.as_str().into(), "bench".into(), BasicConsumeOptions::default(), FieldTable::default())
        .await?;
    let started = Instant::now();
    let account = CpuAccount::start(services());
    for _ in 0..jobs {
        let delivery = consumer.next().await.context("raw consumer ended")??;
        delivery.ack(BasicAckOptions::default()).await?;
    }
    let drain_rate = jobs as f64 / started.elapsed().as_secs_f64();
    print_account("raw drain", &account.per_job(jobs));
    channel.queue_delete(raw_queue.as_str().into(), QueueDeleteOptions::default()).await?;
    Ok((publish_rate, drain_rate))
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
        tokio::time::sleep(Duration::from_millis(2)).await;
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
    delete_keys(&format!("{id}:*")).await;
}

async fn delete_keys(pattern: &str) {
    if let Ok(client) = redis::Client::open(redis_url()) {
        if let Ok(mut con) = client.get_multiplexed_async_connection().await {
            let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query_async(&mut con).await.unwrap_or_default();
            for chunk in keys.chunks(500) {
                for key in chunk {
                    let _: Result<(), _> = redis::cmd("DEL").arg(key).query_async(&mut con).await;
                }
            }
        }
    }
}
