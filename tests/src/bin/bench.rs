//! `fleet-bench` (`make bench`): the fleet against the raw broker, measured in one run on the same
//! quorum queue type with persistence, publisher confirms and manual acks, plus memory, scaling and
//! per-turn overhead. Prints one table: figure, value, target, ratio.
//!
//! The drain is measured three ways on the same jobs (each mode its own N, enqueued through a
//! fleet's API into its work queue just before its drain), each timed from the receiver's first
//! callback to its last: the minimal pipeline (`minimal.rs`: the contract's minimum per job, single acks), the same
//! with batched acks, and the fleet's workers. The minimal pipeline with single acks drains once
//! more after the fleet's, and the fleet is reported as a ratio to the mean of those two drains;
//! the raw broker (consume + ack, single and batched) is the broker's ceiling.
//!
//! The latency (enqueue → callback at half the sustained rate) is split at the 202, and set beside
//! the broker's own confirm time for lone publishes: during a second pass of the same load, and at
//! the same rate with the fleet stopped.
//!
//! Settings: FLEET_BENCH_DRAIN_ONLY (1: only the raw broker and the three drains),
//! FLEET_BENCH_MEMORY_ONLY (1: only the worker's memory with 1000 callbacks in flight),
//! FLEET_BENCH_WORKER_BIN and FLEET_BENCH_DISPATCHER_BIN (another build's binaries), FLEET_BENCH_JOBS (20000), FLEET_BENCH_WORKERS (2), FLEET_BENCH_CLIENTS (32),
//! FLEET_BENCH_CONCURRENCY (32), FLEET_BENCH_LATENCY_JOBS (1000), FLEET_BENCH_TURNS (200),
//! FLEET_BENCH_TURNS_ONLY (1: only the turns: the overhead per turn and the follow-up's start),
//! FLEET_BENCH_AGENT_ONLY (1: only what seed 001's agent parts add to a turn, `agent.rs`),
//! FLEET_BENCH_AGENT_TURNS (50 per variant; also the approval pause's turns of each kind),
//! FLEET_BENCH_REACH_ONLY (1: only seed 002's reach, `reach.rs`: an MCP call's drain beside a
//! callback's, and an approval pause), FLEET_BENCH_REACH_JOBS (5000 per drain),
//! FLEET_BENCH_DATA_ONLY (1: only a data source's query, `data_sources.rs`: directly, through the
//! API, in a turn and drained by one worker), FLEET_BENCH_DATA_QUERIES (300 of each, one at a
//! time), FLEET_BENCH_DATA_BACKLOG (3000 for each drain),
//! FLEET_BENCH_STARTUP_ONLY (1: only how soon a new dispatcher answers its first 202 and a new
//! worker takes its first job from a waiting backlog, `startup.rs`),
//! FLEET_BENCH_HOLD_SECS (with FLEET_BENCH_DRAIN_ONLY: the fleet is kept running this long after
//! its drain, so that a worker run under `valgrind --tool=callgrind` can be dumped; see
//! docs/performance.md), FLEET_BENCH_MINIMAL_BIN (a wrapper the minimal pipeline is run through,
//! given the bench's own path first; each minimal drain is then held FLEET_BENCH_HOLD_SECS too).
//!
//! `make bench-budget` (FLEET_BENCH_BUDGET=1) runs only its last part: turns of two tenants against a
//! provider's quota (see `budget`).
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

#[path = "bench/agent.rs"]
mod agent;
#[path = "bench/data_sources.rs"]
mod data_sources;
#[path = "bench/minimal.rs"]
mod minimal;
#[path = "bench/reach.rs"]
mod reach;
#[path = "bench/startup.rs"]
mod startup;
use fleet_tests::{amqp_url, free_port, redis_url};

/// The bench tool's callback secret.
const SECRET: &str = "bench_secret_0123456789";

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A tool owner that answers after `delay`, recording when each execution first arrived.
struct Receiver {
    addr: std::net::SocketAddr,
    arrivals: Arc<Mutex<HashMap<String, Instant>>>,
    /// Each execution's first arrival, in order.
    times: Arc<Mutex<Vec<Instant>>>,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    _task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct ReceiverState {
    arrivals: Arc<Mutex<HashMap<String, Instant>>>,
    times: Arc<Mutex<Vec<Instant>>>,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    delay: Duration,
}

async fn receive(State(s): State<ReceiverState>, body: Bytes) -> &'static str {
    use std::sync::atomic::Ordering;
    if let Ok(v) = serde_json::from_slice::<Value>(&body) {
        if let Some(id) = v["execution_id"].as_str() {
            let now = Instant::now();
            if let std::collections::hash_map::Entry::Vacant(e) = s.arrivals.lock().unwrap().entry(id.to_string()) {
                e.insert(now);
                s.times.lock().unwrap().push(now);
            }
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
        let state = ReceiverState {
            arrivals: Default::default(),
            times: Default::default(),
            in_flight: Default::default(),
            delay,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().fallback(receive).with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { addr, arrivals: state.arrivals, times: state.times, in_flight: state.in_flight, _task: task }
    }
    fn count(&self) -> usize {
        self.arrivals.lock().unwrap().len()
    }
}

/// Keeps `what` running `FLEET_BENCH_HOLD_SECS` after its drain: a profiler attached to it
/// (`callgrind_control --dump`) reads its counts meanwhile.
async fn hold_for_a_profiler(what: &str) {
    let hold = setting("FLEET_BENCH_HOLD_SECS", 0);
    if hold > 0 {
        eprintln!("fleet-bench: {what} is held {hold} s after its drain");
        tokio::time::sleep(Duration::from_secs(hold as u64)).await;
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
    /// Opens `session`'s stream from its start (`Last-Event-ID: 0-0`).
    async fn open_stream(&self, session: &str) -> anyhow::Result<reqwest::Response> {
        let stream = self
            .http
            .get(format!("{}/v1/sessions/{session}/stream", self.api))
            .bearer_auth(&self.token)
            .header("Last-Event-ID", "0-0")
            .send()
            .await?;
        anyhow::ensure!(stream.status().is_success(), "the session's stream answered {}", stream.status());
        Ok(stream)
    }

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
        // Another build's worker or dispatcher (`FLEET_BENCH_WORKER_BIN`,
        // `FLEET_BENCH_DISPATCHER_BIN`), to compare two builds in one sitting.
        let other = match bin {
            "worker" => std::env::var_os("FLEET_BENCH_WORKER_BIN"),
            "dispatcher" => std::env::var_os("FLEET_BENCH_DISPATCHER_BIN"),
            _ => None,
        };
        let program = other.map(PathBuf::from).unwrap_or_else(|| sibling_binary(bin));
        let mut cmd = Command::new(program);
        cmd.env("FLEET_AMQP_URL", amqp_url())
            .env("FLEET_REDIS_URL", redis_url())
            .env("FLEET_TOPOLOGY_PREFIX", format!("fleet-{}", self.id))
            .env("FLEET_REDIS_KEY_PREFIX", format!("{}:", self.id))
            .env("FLEET_API_TOKENS", &self.token)
            .env("FLEET_SECRETS_KEY", "6b6579206f6620746865207465737420666c6565742c2033322062797465732e")
            .env("FLEET_ALLOW_PRIVATE_CALLBACKS", "true")
            // `FLEET_BENCH_LOG`: the fleet's log filter, to trace a run (default `warn`).
            .env("RUST_LOG", std::env::var("FLEET_BENCH_LOG").unwrap_or_else(|_| "warn".into()))
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
        let port = self.spawn_worker()?;
        wait_ready(&self.http, &format!("http://127.0.0.1:{port}/readyz")).await?;
        Ok(self.workers.last().map(Child::id).unwrap_or_default())
    }

    /// Starts a worker without waiting for it: the port of its HTTP surface.
    fn spawn_worker(&mut self) -> anyhow::Result<u16> {
        let port = free_port();
        let mut cmd = self.command("worker");
        cmd.env("FLEET_WORKER_HTTP_ADDR", format!("127.0.0.1:{port}"));
        self.workers.push(cmd.spawn().context("start worker")?);
        Ok(port)
    }

    async fn register(&self, url: &str) -> anyhow::Result<()> {
        let tool =
            json!({"description":"bench","parameters":{"type":"object"},"callback_url": url,"callback_secret": SECRET});
        let r =
            self.http.put(format!("{}/v1/tools/bench", self.api)).bearer_auth(&self.token).json(&tool).send().await?;
        anyhow::ensure!(r.status().is_success(), "register tool: {}", r.status());
        Ok(())
    }

    /// The seconds the dispatcher spent in `route`'s handler so far, and the requests it served
    /// (its `fleet_http_request_duration_seconds` sum and count).
    async fn served(&self, route: &str) -> anyhow::Result<(f64, f64)> {
        let text = self.http.get(format!("{}/metrics", self.api)).send().await?.text().await?;
        let read = |series: &str| {
            let prefix = format!("fleet_http_request_duration_seconds_{series}{{route=\"{route}\"}} ");
            text.lines().find_map(|l| l.strip_prefix(prefix.as_str())).and_then(|v| v.trim().parse().ok())
        };
        Ok((read("sum").unwrap_or(0.0), read("count").unwrap_or(0.0)))
    }

    /// One tool call: its execution id, when its POST was sent and when its 202 came.
    async fn enqueue(&self, n: usize) -> anyhow::Result<(String, Instant, Instant)> {
        let body = json!({"tool_name":"bench","parameters":{"query":"benchmark payload","n":n},"room_id":"room_1","assistant_id":"asst_1"});
        let sent = Instant::now();
        let resp =
            self.http.post(format!("{}/v1/tool-calls", self.api)).bearer_auth(&self.token).json(&body).send().await?;
        anyhow::ensure!(resp.status().as_u16() == 202, "enqueue answered {}", resp.status());
        let accepted = Instant::now();
        let v: Value = resp.json().await?;
        Ok((v["data"]["execution_id"].as_str().unwrap_or_default().to_string(), sent, accepted))
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
    let (user, system) = cpu_split(pid);
    user + system
}

/// CPU time a process has used so far in user space and in the kernel, in seconds.
fn cpu_split(pid: u32) -> (f64, f64) {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return (0.0, 0.0) };
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("").split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) as f64;
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (tick(11) / per_second, tick(12) / per_second)
}

/// Context switches (voluntary and not) a process's live threads have made so far.
fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.rsplit(':').next()?.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// Where a phase's CPU went: each part's CPU seconds between `start` and `per_job`, divided by the
/// jobs the phase moved. On a machine whose cores are saturated this is what bounds the rate: the
/// rate cannot pass cores / (sum of the parts' CPU per job).
struct CpuAccount {
    parts: Vec<(&'static str, Vec<u32>)>,
    start: Vec<f64>,
    kernel: Vec<f64>,
    switches: Vec<u64>,
    started: Instant,
}

/// `cpu_split` summed over a part's processes.
fn cpu_splits(pids: &[u32]) -> (f64, f64) {
    pids.iter().map(|p| cpu_split(*p)).fold((0.0, 0.0), |(u, k), (pu, pk)| (u + pu, k + pk))
}

impl CpuAccount {
    fn start(parts: Vec<(&'static str, Vec<u32>)>) -> Self {
        let splits: Vec<(f64, f64)> = parts.iter().map(|(_, pids)| cpu_splits(pids)).collect();
        let start = splits.iter().map(|(user, kernel)| user + kernel).collect();
        let kernel = splits.iter().map(|(_, kernel)| *kernel).collect();
        let switches = parts.iter().map(|(_, pids)| pids.iter().map(|p| context_switches(*p)).sum()).collect();
        CpuAccount { parts, start, kernel, switches, started: Instant::now() }
    }

    /// Each part's CPU per job spent in the kernel (its sockets, its wake-ups), in microseconds.
    fn kernel_per_job(&self, jobs: usize) -> Vec<(&'static str, f64)> {
        self.parts
            .iter()
            .zip(&self.kernel)
            .map(|((name, pids), before)| (*name, (cpu_splits(pids).1 - before) * 1e6 / jobs as f64))
            .collect()
    }

    /// Each part's context switches per job.
    fn switches_per_job(&self, jobs: usize) -> Vec<(&'static str, f64)> {
        self.parts
            .iter()
            .zip(&self.switches)
            .map(|((name, pids), before)| {
                let now: u64 = pids.iter().map(|p| context_switches(*p)).sum();
                (*name, now.saturating_sub(*before) as f64 / jobs as f64)
            })
            .collect()
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
    if std::env::args().nth(1).as_deref() == Some("--minimal-pipeline") {
        return minimal::main().await;
    }
    let jobs = setting("FLEET_BENCH_JOBS", 20_000);
    let workers = setting("FLEET_BENCH_WORKERS", 2);
    let clients = setting("FLEET_BENCH_CLIENTS", 32);
    let concurrency = setting("FLEET_BENCH_CONCURRENCY", 32);
    let latency_jobs = setting("FLEET_BENCH_LATENCY_JOBS", 1000);
    let turns = setting("FLEET_BENCH_TURNS", 200);
    println!("fleet-bench: {jobs} jobs, {workers} worker(s) × concurrency {concurrency}, {clients} API clients");
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default()).await?;
    if std::env::var("FLEET_BENCH_PEERS").is_ok_and(|v| v == "1") {
        return peers(&conn, jobs, workers, concurrency, clients).await;
    }
    if std::env::var("FLEET_BENCH_BUDGET").is_ok_and(|v| v == "1") {
        return budget(&conn, workers, &concurrency.to_string(), clients).await;
    }
    if std::env::var("FLEET_BENCH_MEMORY_ONLY").is_ok_and(|v| v == "1") {
        let (baseline, peak, after) = memory(&conn, clients).await?;
        let mib = |kib: u64| format!("{:.1}", kib as f64 / 1024.0);
        println!(
            "worker RSS (MiB): idle {}, 1000 callbacks in flight {}, after {}",
            mib(baseline),
            mib(peak),
            mib(after)
        );
        return Ok(());
    }

    let agent_turns = setting("FLEET_BENCH_AGENT_TURNS", 50);
    if std::env::var("FLEET_BENCH_AGENT_ONLY").is_ok_and(|v| v == "1") {
        let medians = agent::agent_phase(&conn, agent_turns).await?;
        println!();
        agent::print(&medians);
        return Ok(());
    }
    let reach_jobs = setting("FLEET_BENCH_REACH_JOBS", 5000);
    if std::env::var("FLEET_BENCH_REACH_ONLY").is_ok_and(|v| v == "1") {
        let drains = reach::mcp_beside_callback(&conn, reach_jobs, workers, concurrency).await?;
        let pause = reach::approval_pause(&conn, agent_turns).await?;
        println!();
        reach::print(&drains, pause);
        return Ok(());
    }
    let data_queries = setting("FLEET_BENCH_DATA_QUERIES", 300);
    let data_backlog = setting("FLEET_BENCH_DATA_BACKLOG", 3000);
    if std::env::var("FLEET_BENCH_STARTUP_ONLY").is_ok_and(|v| v == "1") {
        let startups = startup::startup_phase(&conn).await?;
        println!();
        startup::print(&startups);
        return Ok(());
    }
    if std::env::var("FLEET_BENCH_DATA_ONLY").is_ok_and(|v| v == "1") {
        let figures = data_sources::data_source_phase(&conn, data_queries, agent_turns, data_backlog).await?;
        println!();
        data_sources::print(&figures);
        return Ok(());
    }
    if std::env::var("FLEET_BENCH_TURNS_ONLY").is_ok_and(|v| v == "1") {
        let (overheads, follow_ups, hops) = turn_phase(&conn, turns).await?;
        println!();
        print_turns(overheads, follow_ups, &hops);
        return Ok(());
    }

    // ---- 1. raw broker ceiling ----
    let raw = raw_broker(&conn, jobs, clients, concurrency * workers).await?;

    // ---- 2. the drain: minimal pipeline, the same with batched acks, the fleet ----
    let receiver = Receiver::start(Duration::ZERO).await;
    let (fleet, drains) = drains(&conn, &receiver, jobs, workers, concurrency, clients).await?;
    let enqueue_rate = drains.enqueue;
    if std::env::var("FLEET_BENCH_DRAIN_ONLY").is_ok_and(|v| v == "1") {
        hold_for_a_profiler("the fleet").await;
        fleet.stop(&conn).await;
        println!();
        print_drains(&raw, &drains);
        return Ok(());
    }
    // Each of the three drains had jobs of its own.
    let done = 3 * jobs;

    // ---- 3. latency ----
    // The maximum sustained rate: producers and workers running together, end to end.
    let sustained_jobs = jobs / 2;
    let started = Instant::now();
    fleet.enqueue_many(done..done + sustained_jobs, clients).await?;
    wait_until(Duration::from_secs(600), || receiver.count() >= done + sustained_jobs).await?;
    let sustained_rate = sustained_jobs as f64 / started.elapsed().as_secs_f64();
    let base = done + sustained_jobs;
    let rate = (sustained_rate / 2.0).max(1.0);
    let served_before = fleet.served("/v1/tool-calls").await?;
    let sent = paced_enqueues(&fleet, base..base + latency_jobs, rate).await?;
    let served = fleet.served("/v1/tool-calls").await?;
    let in_dispatcher_ms = 1000.0 * (served.0 - served_before.0) / (served.1 - served_before.1).max(1.0);
    all_arrived(&receiver, &sent).await?;
    // The same load again, with a tenth as many lone confirmed publishes beside it: the broker's
    // confirm time under that load (this pass's own latencies are not reported).
    let again = base + latency_jobs..base + 2 * latency_jobs;
    let (again, meanwhile) = tokio::join!(
        paced_enqueues(&fleet, again, rate),
        raw_confirm_latencies(&conn, rate / 10.0, latency_jobs.div_ceil(10))
    );
    let (again, mut meanwhile) = (again?, meanwhile?);
    all_arrived(&receiver, &again).await?;
    // End to end, and its two parts: the POST until its 202, the 202 until the callback.
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (mut latencies, mut posts, mut deliveries) = (vec![], vec![], vec![]);
    {
        let at = receiver.arrivals.lock().unwrap();
        for (id, sent, accepted) in &sent {
            latencies.push(ms(at[id].duration_since(*sent)));
            posts.push(ms(accepted.duration_since(*sent)));
            deliveries.push(ms(at[id].saturating_duration_since(*accepted)));
        }
    }
    fleet.stop(&conn).await;
    // The broker's floor: confirmed publishes alone, at the same rate, the fleet stopped.
    let mut confirms = raw_confirm_latencies(&conn, rate, latency_jobs).await?;
    for v in [&mut latencies, &mut posts, &mut deliveries, &mut meanwhile, &mut confirms] {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    }

    // ---- 4. memory: one worker holding 1000 callbacks to a slow receiver ----
    let (baseline, peak, after) = memory(&conn, clients).await?;

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

    // ---- 6. turns: the fleet's own time per turn, beside the model's; follow-ups ----
    let (overheads, follow_ups, hops) = turn_phase(&conn, turns).await?;
    // ---- 7. seed 001's agent parts, each beside the turn without it ----
    let agent_medians = agent::agent_phase(&conn, agent_turns).await?;
    // ---- 8. seed 002's reach: an MCP call beside a callback; an approval pause ----
    let reach_drains = reach::mcp_beside_callback(&conn, reach_jobs, workers, concurrency).await?;
    let approval_pause = reach::approval_pause(&conn, agent_turns).await?;
    let data_figures = data_sources::data_source_phase(&conn, data_queries, agent_turns, data_backlog).await?;
    let startups = startup::startup_phase(&conn).await?;

    let _ = conn.close(200, "".into()).await;
    println!();
    row("figure", "value".into(), "target", "ratio".into());
    print_drains(&raw, &drains);
    row("raw broker: confirmed publish (msg/s)", format!("{:.0}", raw.publish), "ceiling", "".into());
    row(
        "fleet: POST /v1/tool-calls, 202 after confirm (jobs/s)",
        format!("{enqueue_rate:.0}"),
        ">= 50 %",
        format!("{:.0} %", 100.0 * enqueue_rate / raw.publish),
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
        "<= 10 ms",
        "".into(),
    );
    let p50_p99 = |part: &str, values: &[f64]| {
        let (p50, p99) = (percentile(values, 0.50), percentile(values, 0.99));
        row(&format!("  {part}, p50 / p99 (ms)"), format!("{p50:.1} / {p99:.1}"), "", "".into());
    };
    p50_p99("of which POST → 202", &posts);
    p50_p99("of which 202 → callback", &deliveries);
    row("  of which in the dispatcher's handler, mean (ms)", format!("{in_dispatcher_ms:.1}"), "", "".into());
    p50_p99("a raw confirmed publish under the same load", &meanwhile);
    p50_p99("a raw confirmed publish alone", &confirms);
    row("worker RSS: idle (MiB)", format!("{:.1}", baseline as f64 / 1024.0), "", "".into());
    row("worker RSS: 1000 callbacks in flight (MiB)", format!("{:.1}", peak as f64 / 1024.0), "<= 64 MiB", "".into());
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
    print_turns(overheads, follow_ups, &hops);
    agent::print(&agent_medians);
    reach::print(&reach_drains, approval_pause);
    data_sources::print(&data_figures);
    startup::print(&startups);

    // ---- 9. a provider's quota shared by two tenants' turns ----
    println!();
    budget(&conn, workers, &concurrency.to_string(), clients).await
}

/// What the quota provider took and refused, and when.
struct QuotaRun {
    log: Vec<fleet_tests::quota::Arrival>,
}

impl QuotaRun {
    /// The waits from each turn's submission to the provider taking its call, in seconds, sorted.
    fn waits(&self, sent: &HashMap<String, Instant>) -> Vec<f64> {
        let taken = self.log.iter().filter(|a| a.taken);
        let mut waits: Vec<f64> = taken
            .filter_map(|a| sent.get(&a.marker).map(|s| a.at.saturating_duration_since(*s).as_secs_f64()))
            .collect();
        waits.sort_by(f64::total_cmp);
        waits
    }

    /// Requests and tokens the provider took in [from, to), per minute.
    fn rates(&self, from: Instant, to: Instant) -> (f64, f64) {
        let within = self.log.iter().filter(|a| a.taken && a.at >= from && a.at < to);
        let (requests, tokens) = within.fold((0u64, 0u64), |(r, t), a| (r + 1, t + a.tokens));
        let minutes = (to - from).as_secs_f64() / 60.0;
        (requests as f64 / minutes, tokens as f64 / minutes)
    }
}

/// One turn's time outside its model call (ms), and its parts: the POST until its 202, from the
/// 202 until the model call starts (delivery and the step's opening), from the model's answer
/// until the client's poll saw `succeeded` (the step's finish, and the poll's own wait). Beside
/// them, the same ended by the turn's `done` arriving on its session's stream, opened before the
/// POST: no poll's wait in it, and `done` is the step's last write.
struct TurnOverhead {
    total: f64,
    accepted: f64,
    to_model: f64,
    after_model: f64,
    total_by_stream: f64,
    after_model_by_stream: f64,
}

/// What one hop of a turn's path costs on this machine now, timed alone just before the turns (ms,
/// p50): a small Lua script's round trip to Redis (each of the fleet's writes is one) and a
/// confirmed publish to a quorum queue (a turn's acceptance waits for one). A turn's overhead is a
/// chain of such hops, so these bound it: they move with the machine as much as the turn does.
struct HopFloor {
    redis_trip: f64,
    confirmed_publish: f64,
    /// The same, each after a 1 ms pause: as on a turn's path, where each process has gone idle
    /// by the time the chain comes back to it, and each hop pays for waking it.
    redis_trip_after_pause: f64,
    confirmed_publish_after_pause: f64,
}

/// Times `n` of each hop one after another, with nothing else running: back to back, then each
/// after a 1 ms pause.
async fn hop_floor(conn: &Connection, n: usize) -> anyhow::Result<HopFloor> {
    let mut redis = redis::Client::open(redis_url())?.get_multiplexed_async_connection().await?;
    let script = redis::Script::new("redis.call('SET', KEYS[1], ARGV[1], 'EX', 60) return 1");
    let key = format!("bench-hop-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let channel = conn.create_channel().await?;
    let queue = declare_quorum_queue(&channel, "bench-hop").await?;
    channel.confirm_select(Default::default()).await?;
    let mut times: [Vec<f64>; 4] = Default::default();
    for (i, pause) in (0..2 * n).map(|i| (i, i >= n)) {
        if pause {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let sent = Instant::now();
        let _: i64 = script.key(&key).arg(i).invoke_async(&mut redis).await?;
        times[usize::from(pause)].push(sent.elapsed().as_secs_f64() * 1000.0);
        if pause {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let sent = Instant::now();
        let properties = BasicProperties::default().with_delivery_mode(2);
        let options = BasicPublishOptions::default();
        channel.basic_publish("".into(), queue.as_str().into(), options, &[b'x'; 400], properties).await?.await?;
        times[2 + usize::from(pause)].push(sent.elapsed().as_secs_f64() * 1000.0);
    }
    channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await?;
    let [trips, trips_after_pause, confirms, confirms_after_pause] = times.map(median);
    Ok(HopFloor {
        redis_trip: trips,
        confirmed_publish: confirms,
        redis_trip_after_pause: trips_after_pause,
        confirmed_publish_after_pause: confirms_after_pause,
    })
}

/// The turn figures: the fleet's overhead per turn and a follow-up's start after `done`, beside
/// what one hop costs.
fn print_turns(overheads: Vec<TurnOverhead>, mut follow_ups: Vec<f64>, hops: &HopFloor) {
    let part = |f: fn(&TurnOverhead) -> f64| format!("{:.1}", median(overheads.iter().map(f).collect()));
    // `done` is written after the record says `succeeded`: ended by it, the overhead has no poll's
    // wait in it (a 1 ms sleep, rounded up to the timer's next tick, and a GET between looks).
    row("turn: fleet overhead per turn, by the poll, median (ms)", part(|o| o.total), "", "".into());
    row("turn: of which POST → 202, median (ms)", part(|o| o.accepted), "", "".into());
    row("turn: of which 202 → model call, median (ms)", part(|o| o.to_model), "", "".into());
    row("turn: of which answer → succeeded seen, median (ms)", part(|o| o.after_model), "", "".into());
    row(
        "turn: fleet overhead per turn, to `done` streamed, median (ms)",
        part(|o| o.total_by_stream),
        "<= 3 ms",
        "".into(),
    );
    row("turn: of which answer → `done` streamed, median (ms)", part(|o| o.after_model_by_stream), "", "".into());
    let each_hop = [
        ("one Redis script round trip alone", hops.redis_trip),
        ("one confirmed publish alone", hops.confirmed_publish),
        ("one Redis script round trip after a 1 ms pause", hops.redis_trip_after_pause),
        ("one confirmed publish after a 1 ms pause", hops.confirmed_publish_after_pause),
    ];
    for (hop, ms) in each_hop {
        row(&format!("turn: {hop}, p50 (ms)"), format!("{ms:.2}"), "", "".into());
    }
    follow_ups.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (p50, p99) = (percentile(&follow_ups, 0.5), percentile(&follow_ups, 0.99));
    row("turn: follow-up's first event after done, median (ms)", format!("{p50:.1}"), "<= 100 ms", "".into());
    row("turn: follow-up's first event after done, p99 (ms)", format!("{p99:.1}"), "", "".into());
}

/// Part 6: `turns` turns one after another, each in a session of its own (the fleet's time per
/// turn: the time to `succeeded` less the model's); then `turns / 10` pairs of turns in one session,
/// the second posted while the first runs (how long after the first's `done` the second's first
/// event comes).
async fn turn_phase(conn: &Connection, turns: usize) -> anyhow::Result<(Vec<TurnOverhead>, Vec<f64>, HopFloor)> {
    let hops = hop_floor(conn, 300).await?;
    let llm =
        MockLlm::start(|_, _| LlmReply::Text { tokens: vec!["Hi".into(), " there".into()], delay: Duration::ZERO })
            .await;
    let base = llm.base_url();
    let mut fleet = BenchFleet::start(&[("FLEET_LLM_BASE_URL", &base)]).await?;
    fleet.add_worker().await?;
    let mut overheads = Vec::new();
    for n in 0..turns {
        let session = format!("bench_{n}");
        let body = json!({"session_id": session, "assistant": {"id": "a", "model_config": {"model": "m"}}, "messages": [{"role": "user", "content": "hi"}]});
        let done = tokio::spawn(done_at(fleet.open_stream(&session).await?.bytes_stream()));
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
        let accepted = t0.elapsed();
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
        let seen = Instant::now();
        let streamed = done.await??;
        let call = llm.requests().last().map(|r| (r.started, r.ended.unwrap_or(r.started))).context("model call")?;
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        overheads.push(TurnOverhead {
            total: ms((seen - t0).saturating_sub(call.1 - call.0)),
            accepted: ms(accepted),
            to_model: ms(call.0.saturating_duration_since(t0 + accepted)),
            after_model: ms(seen - call.1),
            total_by_stream: ms((streamed - t0).saturating_sub(call.1 - call.0)),
            after_model_by_stream: ms(streamed.saturating_duration_since(call.1)),
        });
    }
    fleet.stop(conn).await;
    let follow_ups = follow_ups((turns / 10).max(5), conn).await?;
    Ok((overheads, follow_ups, hops))
}

/// `pairs` sessions, each given two turns at once (the second a follow-up queued behind the
/// first, whose model is slow enough that the reader is there before its `done`): how long after
/// the first's `done` arrives on the session's stream the next event (the follow-up's first) does,
/// in ms.
async fn follow_ups(pairs: usize, conn: &Connection) -> anyhow::Result<Vec<f64>> {
    let llm = MockLlm::start(|body, _| {
        let follow_up = body["messages"].as_array().is_some_and(|m| m.iter().any(|m| m["content"] == "two"));
        let delay = if follow_up { Duration::ZERO } else { Duration::from_millis(50) };
        LlmReply::Text { tokens: vec!["Hi".into(), " there".into()], delay }
    })
    .await;
    let base = llm.base_url();
    let mut fleet = BenchFleet::start(&[("FLEET_LLM_BASE_URL", &base)]).await?;
    fleet.add_worker().await?;
    let mut gaps = Vec::new();
    for n in 0..pairs {
        let session = format!("follow_{n}");
        for text in ["one", "two"] {
            let body = json!({"session_id": session, "assistant": {"id": "a", "model_config": {"model": "m"}}, "messages": [{"role": "user", "content": text}]});
            let resp =
                fleet.http.post(format!("{}/v1/turns", fleet.api)).bearer_auth(&fleet.token).json(&body).send().await?;
            anyhow::ensure!(resp.status().as_u16() == 202, "a turn answered {}", resp.status());
        }
        let stream = fleet.open_stream(&session).await?;
        gaps.push(gap_after_done(stream.bytes_stream()).await?.as_secs_f64() * 1000.0);
    }
    fleet.stop(conn).await;
    Ok(gaps)
}

/// Reads SSE frames until the one after the first `done`: the time between the two arriving.
async fn gap_after_done(
    frames: impl futures::Stream<Item = reqwest::Result<Bytes>> + Unpin,
) -> anyhow::Result<Duration> {
    let mut done_at = None::<Instant>;
    read_frames(frames, |frame| match done_at {
        Some(at) => Some(at.elapsed()),
        None => {
            done_at = frame.contains("event: done\n").then(Instant::now);
            None
        }
    })
    .await
}

/// Reads SSE frames until the first `done`: when it arrived.
async fn done_at(frames: impl futures::Stream<Item = reqwest::Result<Bytes>> + Unpin) -> anyhow::Result<Instant> {
    read_frames(frames, |frame| frame.contains("event: done\n").then(Instant::now)).await
}

/// Hands each SSE frame (comments left out) to `seen` as it arrives, until it answers.
async fn read_frames<T>(
    mut frames: impl futures::Stream<Item = reqwest::Result<Bytes>> + Unpin,
    mut seen: impl FnMut(&str) -> Option<T>,
) -> anyhow::Result<T> {
    let mut buf = String::new();
    loop {
        let chunk =
            tokio::time::timeout(Duration::from_secs(30), frames.next()).await?.context("the stream ended")??;
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            if frame.starts_with(':') {
                continue;
            }
            if let Some(answer) = seen(&frame) {
                return Ok(answer);
            }
        }
    }
}

/// Posts a turn whose user message is `marker` in a session of its own; when it was sent.
/// A turn of the tenant its marker names: `A-…` tenant A's, `B-…` tenant B's, `idle-…` a tenant
/// of its own (B's twin on the idle fleet: it has sent nothing before, as B has not).
async fn post_marked_turn(fleet: &BenchFleet, marker: String) -> anyhow::Result<(String, Instant)> {
    let tenant = match marker.split('-').next() {
        Some("A") => "tenant-a",
        Some("B") => "tenant-b",
        _ => "tenant-idle",
    };
    let body = json!({"session_id": format!("s_{marker}"), "tenant": tenant, "assistant": {"id": "a", "instructions": "Answer briefly.", "model_config": {"model": "m", "max_tokens": 300}}, "messages": [{"role": "user", "content": marker}]});
    let sent = Instant::now();
    let resp = fleet.http.post(format!("{}/v1/turns", fleet.api)).bearer_auth(&fleet.token).json(&body).send().await?;
    anyhow::ensure!(resp.status().as_u16() == 202, "a turn answered {}", resp.status());
    ACCEPTED.lock().unwrap().insert(marker.clone(), sent.elapsed().as_secs_f64());
    if std::env::var_os("FLEET_BENCH_LOG").is_some() && marker.starts_with("B-") {
        let body: Value = resp.json().await?;
        eprintln!("bench: {marker} is {} (sent at {:?})", body["data"]["execution_id"], std::time::SystemTime::now());
    }
    Ok((marker, sent))
}

/// How long each marked turn's POST took to answer 202 (s): the dispatcher's part of a wait.
static ACCEPTED: std::sync::LazyLock<std::sync::Mutex<HashMap<String, f64>>> =
    std::sync::LazyLock::new(Default::default);

/// The p99 of the marked turns' POST times whose markers start with `prefix`.
fn accepted_p99(prefix: &str) -> f64 {
    let mut times: Vec<f64> =
        ACCEPTED.lock().unwrap().iter().filter(|(m, _)| m.starts_with(prefix)).map(|(_, t)| *t).collect();
    times.sort_by(f64::total_cmp);
    percentile(&times, 0.99)
}

async fn post_marked_turns(
    fleet: &BenchFleet,
    prefix: &str,
    n: usize,
    clients: usize,
) -> anyhow::Result<HashMap<String, Instant>> {
    let posts = futures::stream::iter(0..n).map(|i| post_marked_turn(fleet, format!("{prefix}-{i}")));
    let results: Vec<_> = posts.buffer_unordered(clients).collect().await;
    results.into_iter().collect()
}

/// `make bench-budget` (FLEET_BENCH_BUDGET=1; also the last part of `make bench`): a provider
/// enforcing 600 requests and 200,000 tokens a minute (429 beyond), the fleet's budget set to
/// FLEET_BENCH_BUDGET_PERCENT (97) % of it. Tenant A submits FLEET_BENCH_BUDGET_TURNS (2,000)
/// turns at once, tenant B 20 a second later; a minute in, the provider answers 429 to everything
/// for a second. Reports 429s, the rate sustained, B's p99 wait (beside B alone on an idle
/// fleet) and how fast the fleet stops calling after the surprise 429.
async fn budget(conn: &Connection, workers: usize, concurrency: &str, clients: usize) -> anyhow::Result<()> {
    let a_turns = setting("FLEET_BENCH_BUDGET_TURNS", 2000);
    let percent = setting("FLEET_BENCH_BUDGET_PERCENT", 97) as u64;
    let (rpm, tpm) = (600u64, 200_000u64);
    let quota = fleet_tests::quota::QuotaLlm::start(rpm, tpm, 300).await;
    let budget =
        json!({"requests_per_minute": rpm * percent / 100, "tokens_per_minute": tpm * percent / 100}).to_string();
    let base = quota.base_url();
    let env = [
        ("FLEET_LLM_BASE_URL", base.as_str()),
        ("FLEET_LLM_BUDGET", &budget),
        ("FLEET_WORKER_CONCURRENCY", concurrency),
    ];
    let mut fleet = BenchFleet::start(&env).await?;
    for _ in 0..workers {
        fleet.add_worker().await?;
    }
    let taken = |prefix: &str| quota.log().iter().filter(|a| a.taken && a.marker.starts_with(prefix)).count();

    // B alone on an idle fleet.
    let idle_sent = post_marked_turns(&fleet, "idle", 20, clients).await?;
    wait_until(Duration::from_secs(60), || taken("idle-") >= 20).await?;
    let idle = QuotaRun { log: quota.log() }.waits(&idle_sent);

    // A's burst, B a second later, the surprise a minute in.
    let started = Instant::now();
    let b_delay = setting("FLEET_BENCH_BUDGET_B_DELAY", 1) as u64;
    let a_posts = async {
        let sent = post_marked_turns(&fleet, "A", a_turns, clients).await;
        (sent, started.elapsed())
    };
    let ((a_sent, a_accepted_in), b_sent) = tokio::join!(a_posts, async {
        tokio::time::sleep(Duration::from_secs(b_delay)).await;
        post_marked_turns(&fleet, "B", 20, clients).await
    });
    let (_a_sent, b_sent) = (a_sent?, b_sent?);
    let until_surprise = Duration::from_secs(60).saturating_sub(started.elapsed());
    tokio::time::sleep(until_surprise).await;
    let surprise_at = Instant::now();
    quota.surprise(Duration::from_secs(1));
    wait_until(Duration::from_secs(1200), || taken("A-") + taken("B-") >= a_turns + 20).await?;
    let finished = started.elapsed();
    fleet.stop(conn).await;
    let run = QuotaRun { log: quota.log() };
    budget_report(&run, started, surprise_at, finished, (rpm, tpm, percent), &idle, &run.waits(&b_sent));
    let a_rate = a_turns as f64 / a_accepted_in.as_secs_f64();
    println!("tenant A: {a_turns} turns accepted in {:.2} s ({a_rate:.0} turns/s)", a_accepted_in.as_secs_f64());
    b_breakdown(&run, &b_sent);
    Ok(())
}

/// Where B's wait went: each of its waits, and how many of A's calls the provider took while B
/// had a turn waiting (the line admitting A ahead of B, against the machine being busy).
fn b_breakdown(run: &QuotaRun, b_sent: &HashMap<String, Instant>) {
    let waits = run.waits(b_sent);
    let list: Vec<String> = waits.iter().map(|w| format!("{w:.3}")).collect();
    println!("tenant B's waits behind A's burst (s): {}", list.join(" "));
    let first = b_sent.values().min().copied();
    let b_calls = run.log.iter().filter(|a| a.taken && a.marker.starts_with("B-"));
    let (Some(first), Some(last)) = (first, b_calls.map(|a| a.at).max()) else { return };
    let a_between = run.log.iter().filter(|a| a.taken && a.marker.starts_with("A-") && a.at > first && a.at <= last);
    println!("A's calls taken between B's first submit and B's last call: {}", a_between.count());
}

fn budget_report(
    run: &QuotaRun,
    started: Instant,
    surprise_at: Instant,
    finished: Duration,
    (rpm, tpm, percent): (u64, u64, u64),
    idle: &[f64],
    b: &[f64],
) {
    let surprise_end = surprise_at + Duration::from_secs(1);
    let refused = run.log.iter().filter(|a| !a.taken && a.at >= started);
    let (in_surprise, outside): (Vec<_>, Vec<_>) = refused.partition(|a| a.at >= surprise_at && a.at < surprise_end);
    // The steady part: after the first 15 s of burst, before the surprise.
    let (requests, tokens) = run.rates(started + Duration::from_secs(15), surprise_at);
    let first_429 = in_surprise.first().map(|a| a.at);
    // After the first surprise 429, the last call that still reached the provider before its
    // 2 s Retry-After ran out: how long the fleet took to stop calling.
    let stopped_after = first_429.map(|first| {
        let pause_end = first + Duration::from_secs(2);
        let late = run.log.iter().filter(|a| a.at > first && a.at < pause_end).map(|a| a.at);
        late.max().map_or(0.0, |last| (last - first).as_secs_f64())
    });
    let row = |figure: &str, value: String, target: &str| println!("{figure:<66} {value:>12} {target:>16}");
    println!(
        "provider quota {rpm} requests and {tpm} tokens a minute; fleet budget {percent} % of it; all done in {:.0} s",
        finished.as_secs_f64()
    );
    row("figure", "value".into(), "target");
    row("429s outside the surprise (budget just under the quota)", outside.len().to_string(), "0");
    row(
        "requests taken per minute, steady (fraction of 600)",
        format!("{requests:.0} ({:.1} %)", 100.0 * requests / rpm as f64),
        "",
    );
    row(
        "tokens taken per minute, steady (fraction of 200,000)",
        format!("{tokens:.0} ({:.1} %)", 100.0 * tokens / tpm as f64),
        ">= 95 % of the binding one",
    );
    row("tenant B: p99 wait submit → model call, idle fleet (s)", format!("{:.3}", percentile(idle, 0.99)), "");
    row(
        "tenant B: p99 wait submit → model call, behind A's burst (s)",
        format!("{:.3} ({:.1}× idle)", percentile(b, 0.99), percentile(b, 0.99) / percentile(idle, 0.99)),
        "<= 2× idle",
    );
    row("tenant B: of which p99 submit → 202 (the dispatcher) (s)", format!("{:.2}", accepted_p99("B-")), "");
    row("tenant A: p99 submit → 202 (s)", format!("{:.2}", accepted_p99("A-")), "");
    row("surprise: 429s during the 1 s window", in_surprise.len().to_string(), "");
    row(
        "surprise: last call reaching the provider after the first 429 (s)",
        stopped_after.map_or("-".into(), |s| format!("{s:.2}")),
        "<= 2 s",
    );
}

/// One worker's RSS (KiB) idle, holding 1000 callbacks to a slow receiver, and after they finished.
async fn memory(conn: &Connection, clients: usize) -> anyhow::Result<(u64, u64, u64)> {
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
    fleet.stop(conn).await;
    Ok((baseline, peak, after))
}

fn row(figure: &str, value: String, target: &str, ratio: String) {
    println!("{figure:<58} {value:>12} {target:>14} {ratio:>10}")
}

fn print_drains(raw: &Raw, drains: &Drains) {
    row("raw broker: drain, consume+ack, single acks (msg/s)", format!("{:.0}", raw.drain), "", "".into());
    row("raw broker: drain, acks batched (msg/s)", format!("{:.0}", raw.drain_batched), "ceiling", "".into());
    row(
        "minimal pipeline: single acks, before / after the fleet (jobs/s)",
        format!("{:.0} / {:.0}", drains.minimal, drains.minimal_after),
        "",
        format!("{:.2}×", drains.minimal_after / drains.minimal),
    );
    row(
        "minimal pipeline: single acks, their mean (jobs/s)",
        format!("{:.0}", drains.yardstick()),
        "yardstick",
        "".into(),
    );
    row(
        "minimal pipeline: acks batched (jobs/s)",
        format!("{:.0}", drains.minimal_batched),
        "",
        format!("{:.2}×", drains.minimal_batched / drains.yardstick()),
    );
    row(
        "fleet: drain, claim+signed POST+result+ack (jobs/s)",
        format!("{:.0}", drains.fleet),
        ">= 0.8× minimal",
        format!("{:.2}×", drains.fleet / drains.yardstick()),
    );
    row("fleet / the minimal drain before it alone", "".into(), "", format!("{:.2}×", drains.fleet / drains.minimal));
    row(
        "fleet drain / raw drain with batched acks",
        "".into(),
        "",
        format!("{:.0} %", 100.0 * drains.fleet / raw.drain_batched),
    );
}

/// The drain rates of one run, jobs/s, each from the receiver's first callback to its last.
struct Drains {
    /// `POST /v1/tool-calls` (202 after the broker's confirm) while nothing drains.
    enqueue: f64,
    /// The minimal pipeline (single acks) before the fleet's drain, and again after it.
    minimal: f64,
    minimal_after: f64,
    minimal_batched: f64,
    fleet: f64,
}

impl Drains {
    /// The yardstick: the minimal pipeline's two drains on either side of the fleet's, averaged.
    fn yardstick(&self) -> f64 {
        (self.minimal + self.minimal_after) / 2.0
    }
}

/// The three drains of `jobs` jobs each, enqueued through a dispatcher's API into its work queue
/// beforehand: the minimal pipeline (single acks, then batched), each on a fleet of its own
/// (`Yardstick`), then the fleet's `workers` started together on the jobs its own enqueue
/// measured, made after the yardstick's drains. Returns the fleet, still running, for the phases after.
async fn drains(
    conn: &Connection,
    receiver: &Receiver,
    jobs: usize,
    workers: usize,
    concurrency: usize,
    clients: usize,
) -> anyhow::Result<(BenchFleet, Drains)> {
    // The light lane off: every job waits in the work queue, the one queue the minimal pipeline
    // drains (one tenant's backlog would send it only its first 200 anyway).
    let env = [("FLEET_WORKER_CONCURRENCY", concurrency.to_string()), ("FLEET_LIGHT_LANE_CALL_RATE", "0".into())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut fleet = BenchFleet::start(&env).await?;
    fleet.register(&format!("http://{}/bench", receiver.addr)).await?;
    // The fleet's jobs are enqueued after the yardstick's drains, so that each drain runs with
    // only its own jobs in the broker.
    let yardstick = Yardstick { conn, receiver, env: &env, jobs, workers, concurrency, clients };
    let minimal = yardstick.drain(false).await?;
    let minimal_batched = yardstick.drain(true).await?;
    let account = CpuAccount::start(fleet.parts());
    let enqueue = fleet.enqueue_many(0..jobs, clients).await?;
    print_account("fleet enqueue", &account.per_job(jobs));
    let fleet_rate = fleet_drain(&mut fleet, receiver, jobs, workers).await?;
    // Again after the fleet's drain: this machine's speed drifts within a run (the same drain has
    // moved 30 % between runs minutes apart), and the fleet is measured against both sides of it.
    let minimal_after = yardstick.drain(false).await?;
    Ok((fleet, Drains { enqueue, minimal, minimal_batched, fleet: fleet_rate, minimal_after }))
}

/// What a minimal pipeline's drain runs on.
struct Yardstick<'a> {
    conn: &'a Connection,
    receiver: &'a Receiver,
    env: &'a [(&'a str, &'a str)],
    jobs: usize,
    workers: usize,
    concurrency: usize,
    clients: usize,
}

impl Yardstick<'_> {
    /// The minimal pipeline on `jobs` jobs enqueued through a fleet of their own (a dispatcher and
    /// its topology, no workers), stopped afterwards. The deliveries it had not acked when it was
    /// stopped go back to that fleet's queue: in the fleet's own, they were copies whose claims
    /// (`SET NX` of a bare word) the fleet's claim script cannot read, and its drain paid for them.
    async fn drain(&self, batched_acks: bool) -> anyhow::Result<f64> {
        let queues = BenchFleet::start(self.env).await?;
        queues.register(&format!("http://{}/bench", self.receiver.addr)).await?;
        queues.enqueue_many(0..self.jobs, self.clients).await?;
        let rate = minimal_drain(&queues, self.receiver, self.jobs, self.workers, self.concurrency, batched_acks).await;
        queues.stop(self.conn).await;
        rate
    }
}

/// The minimal pipeline (`minimal.rs`, a process of its own) on the `jobs` jobs in the fleet's work
/// queue: `workers` consumers with the fleet's concurrency as their prefetch.
async fn minimal_drain(
    fleet: &BenchFleet,
    receiver: &Receiver,
    jobs: usize,
    workers: usize,
    concurrency: usize,
    batched_acks: bool,
) -> anyhow::Result<f64> {
    let topology =
        fleet_protocol::topology::Topology::new(format!("fleet-{}", fleet.id), fleet_protocol::retry::default_delays());
    let settings = minimal::Settings {
        queue: topology.work_queue(fleet_protocol::envelope::JobKind::ToolCall),
        key_prefix: format!("{}:", fleet.id),
        receiver_url: format!("http://{}/bench", receiver.addr),
        secret: SECRET.into(),
        consumers: workers,
        prefetch: concurrency as u16,
        batched_acks,
    };
    let before = receiver.count();
    // A wrapper that runs the same program under a profiler (`FLEET_BENCH_MINIMAL_BIN`, given the
    // bench's path and `--minimal-pipeline`), as `FLEET_BENCH_WORKER_BIN` does for a worker.
    let mut command = match std::env::var_os("FLEET_BENCH_MINIMAL_BIN") {
        Some(wrapper) => {
            let mut c = Command::new(wrapper);
            c.arg(std::env::current_exe()?);
            c
        }
        None => Command::new(std::env::current_exe()?),
    };
    let mut child = command
        .arg("--minimal-pipeline")
        .envs(settings.env())
        .stdin(Stdio::null())
        .spawn()
        .context("start the minimal pipeline")?;
    let mut parts = fleet.parts();
    parts.push(("pipeline", vec![child.id()]));
    let title = if batched_acks { "minimal pipeline, acks batched" } else { "minimal pipeline" };
    let rate = timed_drain(receiver, before, jobs, parts, title).await;
    if std::env::var_os("FLEET_BENCH_MINIMAL_BIN").is_some() {
        hold_for_a_profiler(&format!("the minimal pipeline (pid {})", child.id())).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    rate
}

/// The fleet's `workers`, started together, on the `jobs` jobs in its work queue.
async fn fleet_drain(fleet: &mut BenchFleet, receiver: &Receiver, jobs: usize, workers: usize) -> anyhow::Result<f64> {
    let before = receiver.count();
    let mut ports = vec![];
    for _ in 0..workers {
        ports.push(fleet.spawn_worker()?);
    }
    let mut parts = fleet.parts();
    parts.push(("workers", fleet.workers.iter().map(Child::id).collect()));
    let rate = timed_drain(receiver, before, jobs, parts, "fleet drain").await;
    for port in ports {
        wait_ready(&fleet.http, &format!("http://127.0.0.1:{port}/readyz")).await?;
    }
    rate
}

/// Waits for the first of `jobs` callbacks after the first `before`, then for the last: the rate
/// between them, and where the CPU went meanwhile (charged from the first callback on, so start-up
/// is not in it).
async fn timed_drain(
    receiver: &Receiver,
    before: usize,
    jobs: usize,
    parts: Vec<(&'static str, Vec<u32>)>,
    title: &str,
) -> anyhow::Result<f64> {
    wait_until(Duration::from_secs(120), || receiver.count() > before).await?;
    let account = CpuAccount::start(parts);
    let counted_from = receiver.count();
    wait_until(Duration::from_secs(600), || receiver.count() >= before + jobs).await?;
    let counted = before + jobs - counted_from;
    print_account(title, &account.per_job(counted));
    let switches: Vec<String> =
        account.switches_per_job(counted).iter().map(|(name, n)| format!("{name} {n:.1}")).collect();
    println!("context switches per job, {title}: {}", switches.join(", "));
    let kernel: Vec<String> =
        account.kernel_per_job(counted).iter().map(|(name, us)| format!("{name} {us:.0}")).collect();
    println!("of which in the kernel, µs per job, {title}: {}", kernel.join(", "));
    let times = receiver.times.lock().unwrap();
    let span = times[before + jobs - 1].duration_since(times[before]).as_secs_f64();
    Ok((jobs - 1) as f64 / span)
}

/// `make bench-peers`: the fleet's drain and Celery's, the same job to the same receiver.
async fn peers(
    conn: &Connection,
    jobs: usize,
    workers: usize,
    concurrency: usize,
    clients: usize,
) -> anyhow::Result<()> {
    let receiver = Receiver::start(Duration::ZERO).await;
    let (fleet, drains) = drains(conn, &receiver, jobs, workers, concurrency, clients).await?;
    fleet.stop(conn).await;
    let celery_rate = celery_drain(conn, &receiver, jobs).await?;
    println!("{:<52} {:>10}", "minimal pipeline drain, mean of two (jobs/s)", format!("{:.0}", drains.yardstick()));
    println!("{:<52} {:>10}", "fleet drain (jobs/s)", format!("{:.0}", drains.fleet));
    println!("{:<52} {:>10}", "Celery 5.7 drain, prefork × 4, acks_late (jobs/s)", format!("{celery_rate:.0}"));
    println!("{:<52} {:>10}   target >= 10×", "fleet / Celery", format!("{:.1}×", drains.fleet / celery_rate));
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
    let mut worker = peer(venv.join("bin/celery"))
        .args(["-A", "celery_peer", "worker", "-P", "prefork", "-c", "4", "-Q", &queue, "-l", "WARNING"])
        .args(["--without-gossip", "--without-mingle", "--without-heartbeat"])
        .stdout(Stdio::null())
        .spawn()
        .context("start the Celery worker")?;
    let drained = timed_drain(receiver, before, jobs, services(), "Celery drain").await;
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
    drained
}

/// The raw broker's rates on a quorum queue of its own: confirmed persistent publishes, and a
/// consumer that only acks (one by one, then in batches), timed from its first delivery.
struct Raw {
    publish: f64,
    drain: f64,
    drain_batched: f64,
}

async fn raw_broker(conn: &Connection, jobs: usize, window: usize, prefetch: usize) -> anyhow::Result<Raw> {
    let channel = conn.create_channel().await?;
    let raw_queue = declare_quorum_queue(&channel, "bench-raw").await?;
    channel.confirm_select(Default::default()).await?;
    let publish = raw_publish(&channel, &raw_queue, jobs, window).await?;
    let drain = raw_drain(conn, &raw_queue, jobs, prefetch, false).await?;
    raw_publish(&channel, &raw_queue, jobs, window).await?;
    let drain_batched = raw_drain(conn, &raw_queue, jobs, prefetch, true).await?;
    channel.queue_delete(raw_queue.as_str().into(), QueueDeleteOptions::default()).await?;
    Ok(Raw { publish, drain, drain_batched })
}

/// Waits until every call of `sent` reached `receiver`.
async fn all_arrived(receiver: &Receiver, sent: &[(String, Instant, Instant)]) -> anyhow::Result<()> {
    wait_until(Duration::from_secs(120), || {
        let at = receiver.arrivals.lock().unwrap();
        sent.iter().all(|(id, ..)| at.contains_key(id))
    })
    .await
}

/// Tool calls `range` through the API at `rate` a second: their ids, with when each was sent and
/// accepted.
async fn paced_enqueues(
    fleet: &BenchFleet,
    range: std::ops::Range<usize>,
    rate: f64,
) -> anyhow::Result<Vec<(String, Instant, Instant)>> {
    let start = range.start;
    paced(range.len(), rate, |i| fleet.enqueue(start + i)).await
}

/// Starts `make(0)`, `make(1)`, … up to `n`, one every 1/`rate` s whatever the ones before are
/// waiting for, and collects what they answer. Those in flight are polled between ticks too: a
/// future ends when its answer comes, not at the next tick.
async fn paced<T, F: std::future::Future<Output = anyhow::Result<T>>>(
    n: usize,
    rate: f64,
    mut make: impl FnMut(usize) -> F,
) -> anyhow::Result<Vec<T>> {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut started, mut out) = (0, Vec::with_capacity(n));
    let mut inflight = futures::stream::FuturesUnordered::new();
    loop {
        tokio::select! {
            _ = tick.tick(), if started < n => {
                inflight.push(make(started));
                started += 1;
            }
            Some(done) = inflight.next(), if !inflight.is_empty() => out.push(done?),
            else => break,
        }
    }
    Ok(out)
}

/// Publish → confirm times (ms) of `jobs` persistent messages published at `rate` a second to a
/// quorum queue of their own, each on its own: what the broker adds to a 202 at that rate.
async fn raw_confirm_latencies(conn: &Connection, rate: f64, jobs: usize) -> anyhow::Result<Vec<f64>> {
    let channel = conn.create_channel().await?;
    let queue = declare_quorum_queue(&channel, "bench-confirm").await?;
    channel.confirm_select(Default::default()).await?;
    let payload = vec![b'x'; 400];
    let publish = |_| {
        let (channel, queue, payload) = (&channel, &queue, &payload);
        async move {
            let sent = Instant::now();
            let properties = BasicProperties::default().with_delivery_mode(2);
            let options = BasicPublishOptions::default();
            channel.basic_publish("".into(), queue.as_str().into(), options, payload, properties).await?.await?;
            anyhow::Ok(sent.elapsed().as_secs_f64() * 1000.0)
        }
    };
    let times = paced(jobs, rate, publish).await?;
    channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await?;
    Ok(times)
}

/// Declares a durable quorum queue named `prefix` and a random suffix; its name.
async fn declare_quorum_queue(channel: &lapin::Channel, prefix: &str) -> anyhow::Result<String> {
    let queue = format!("{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), AMQPValue::LongString(LongString::from(b"quorum".to_vec())));
    let durable = QueueDeclareOptions { durable: true, ..Default::default() };
    channel.queue_declare(queue.as_str().into(), durable, args).await?;
    Ok(queue)
}

async fn raw_publish(channel: &lapin::Channel, queue: &str, jobs: usize, window: usize) -> anyhow::Result<f64> {
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
                queue.into(),
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
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    print_account("raw confirmed publish", &account.per_job(jobs));
    Ok(rate)
}

async fn raw_drain(conn: &Connection, queue: &str, jobs: usize, prefetch: usize, batched: bool) -> anyhow::Result<f64> {
    let consume = conn.create_channel().await?;
    consume.basic_qos(prefetch as u16, BasicQosOptions::default()).await?;
    let mut consumer = consume
        .basic_consume(queue.into(), "bench".into(), BasicConsumeOptions::default(), FieldTable::default())
        .await?;
    let acks = fleet_platform::acks::BatchAcks::new(consume.clone(), Duration::from_millis(2));
    let stop = tokio_util::sync::CancellationToken::new();
    let flusher = tokio::spawn(acks.clone().run(stop.clone()));
    let first = consumer.next().await.context("raw consumer ended")??;
    let started = Instant::now();
    let account = CpuAccount::start(services());
    let mut next = Some(first);
    for n in 0..jobs {
        let delivery = match next.take() {
            Some(d) => d,
            None => consumer.next().await.context("raw consumer ended")??,
        };
        if batched {
            acks.delivered(delivery.delivery_tag);
            acks.ack(delivery.delivery_tag);
        } else {
            delivery.ack(BasicAckOptions::default()).await?;
        }
        if n + 1 == jobs {
            break;
        }
    }
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    print_account(if batched { "raw drain, acks batched" } else { "raw drain" }, &account.per_job(jobs));
    stop.cancel();
    let _ = flusher.await;
    let _ = consume.close(200, "drained".into()).await;
    Ok(rate)
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
