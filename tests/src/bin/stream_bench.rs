//! `fleet-stream-bench` (`make bench-streams`): session SSE streams at scale, against a Redis
//! server of its own (so only the fleet's commands are counted). Prints the Redis commands/s with
//! no stream, 2,000 and 10,000 idle streams (one session each: the worst case for per-session
//! readers), the dispatcher's RSS at each, and the event latency (Redis stream id time to receipt)
//! p50/p99 with 1,000 streams each receiving a turn.
//!
//! Settings: FLEET_BENCH_IDLE_STREAMS ("2000,10000"), FLEET_BENCH_ACTIVE_STREAMS (1000),
//! FLEET_BENCH_WINDOW_SECS (5), FLEET_BENCH_WORKERS (2).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::redis_instance::RedisInstance;
use fleet_tests::sse::{commands_per_second, open_stream, Next, SseReader};
use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
use fleet_tests::{spawn_fleet, Fleet};

fn setting(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// Raises this process's open-file limit to its hard limit (the dispatcher, started after, inherits it).
fn raise_fd_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit on this process with a valid, initialised struct.
    unsafe {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        limit.rlim_cur
    }
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Opens `n` more streams, on sessions `{prefix}{from}…`, and waits until each has sent its first bytes.
async fn open_streams(http: &reqwest::Client, fleet: &Fleet, prefix: &str, from: usize, n: usize) -> Vec<SseReader> {
    futures::stream::iter(from..from + n)
        .map(|i| async move {
            let resp = open_stream(http, fleet, &format!("{prefix}{i}"), "", &[]).await;
            assert_eq!(resp.status(), 200, "stream {i}");
            let mut reader = SseReader::new(resp);
            reader.opened(Duration::from_secs(60)).await;
            reader
        })
        .buffer_unordered(200)
        .collect()
        .await
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let fds = raise_fd_limit();
    let idle_steps: Vec<usize> =
        setting("FLEET_BENCH_IDLE_STREAMS", "2000,10000").split(',').filter_map(|s| s.trim().parse().ok()).collect();
    let active: usize = setting("FLEET_BENCH_ACTIVE_STREAMS", "1000").parse()?;
    let window = Duration::from_secs(setting("FLEET_BENCH_WINDOW_SECS", "5").parse()?);
    let workers: usize = setting("FLEET_BENCH_WORKERS", "2").parse()?;
    println!("open-file limit {fds}; own redis-server; window {window:?}");

    let redis = RedisInstance::start(&["--maxclients", "20000"]).await;
    let llm = MockLlm::start(|_, _| LlmReply::text("a short streamed answer")).await;
    let options = llm_fleet(&llm).workers(workers).env("FLEET_REDIS_URL", &redis.url()).env("RUST_LOG", "error");
    let fleet = spawn_fleet(options).await;
    let pid = fleet.dispatcher_pid().expect("dispatcher");
    let http = reqwest::Client::builder().pool_max_idle_per_host(0).timeout(Duration::from_secs(3600)).build()?;

    let mut rows: Vec<(String, String)> = Vec::new();
    let base = commands_per_second(&redis.url(), window).await;
    rows.push(("Redis commands/s, no stream".into(), format!("{base:.1}")));
    rows.push(("dispatcher RSS, no stream (MiB)".into(), format!("{:.1}", rss_mib(pid))));
    let mut idle = Vec::new();
    for &target in &idle_steps {
        let started = Instant::now();
        let more = open_streams(&http, &fleet, "s_idle_", idle.len(), target.saturating_sub(idle.len())).await;
        idle.extend(more);
        let opened_in = started.elapsed();
        let rate = commands_per_second(&redis.url(), window).await;
        rows.push((format!("Redis commands/s, {target} idle streams"), format!("{rate:.1}")));
        rows.push((format!("dispatcher RSS, {target} idle streams (MiB)"), format!("{:.1}", rss_mib(pid))));
        rows.push((format!("time to open up to {target} streams"), format!("{opened_in:.1?}")));
    }
    drop(idle);

    let mut readers = open_streams(&http, &fleet, "s_active_", 0, active).await;
    let started = Instant::now();
    let receiving = readers
        .iter_mut()
        .map(|reader| async move {
            // Each frame's id is the (same machine's) Redis time it was appended.
            let mut latencies = Vec::new();
            loop {
                match reader.next(Duration::from_secs(600)).await {
                    Next::Frame(f) => {
                        latencies.push(now_ms().saturating_sub(id_ms(&f.id)));
                        if f.event == "done" {
                            return latencies;
                        }
                    }
                    other => panic!("a stream stopped before done: {other:?}"),
                }
            }
        })
        .collect::<futures::stream::FuturesUnordered<_>>()
        .collect::<Vec<_>>();
    let posting = async {
        futures::stream::iter(0..active)
            .for_each_concurrent(32, |i| {
                let fleet = &fleet;
                async move {
                    post_turn(fleet, &turn_body(&format!("s_active_{i}"), "hi", &[])).await;
                }
            })
            .await;
    };
    let rss_during = async {
        let mut peak = 0.0f64;
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            peak = peak.max(rss_mib(pid));
        }
        peak
    };
    let (latencies, (), peak) = tokio::join!(receiving, posting, rss_during);
    let mut all: Vec<u64> = latencies.into_iter().flatten().collect();
    all.sort_unstable();
    rows.push((format!("{active} streams each receiving a turn: events"), all.len().to_string()));
    rows.push(("  wall time".into(), format!("{:.1?}", started.elapsed())));
    rows.push(("  event latency p50 (ms)".into(), percentile(&all, 0.50).to_string()));
    rows.push(("  event latency p99 (ms)".into(), percentile(&all, 0.99).to_string()));
    rows.push(("  dispatcher RSS peak (MiB)".into(), format!("{peak:.1}")));

    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in rows {
        println!("{k:<width$}  {v}");
    }
    Ok(())
}

/// The millisecond part of a Redis stream id.
fn id_ms(id: &str) -> u64 {
    id.split('-').next().and_then(|ms| ms.parse().ok()).unwrap_or(0)
}
