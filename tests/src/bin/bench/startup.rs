//! Part 10: how soon a process starts working (issue 51's goal 4). With a fleet's topology and its
//! tool in place, a new dispatcher process is started and asked for a tool call every
//! millisecond: the time from its start to its first 202. Then, with a backlog of calls waiting
//! and no worker, a new worker process is started: the time from its start to its first callback
//! reaching the receiver (it connects, declares, consumes, takes its prefetch). Rounds of each on
//! fleets of their own; each figure is the median and the worst of its rounds.

use std::time::{Duration, Instant};

use lapin::Connection;
use serde_json::json;

use super::{median, row, wait_until, BenchFleet, Receiver};

const ROUNDS: usize = 7;
/// The backlog waiting for the new worker.
const BACKLOG: usize = 200;

/// Each round's times (ms): the dispatcher's first 202, the worker's first job.
#[derive(Default)]
pub(super) struct Startups {
    dispatcher_ms: Vec<f64>,
    worker_ms: Vec<f64>,
}

pub(super) async fn startup_phase(conn: &Connection) -> anyhow::Result<Startups> {
    let receiver = Receiver::start(Duration::ZERO).await;
    let mut startups = Startups::default();
    for _ in 0..ROUNDS {
        let mut fleet = BenchFleet::start(&[]).await?;
        fleet.register(&format!("http://{}/startup", receiver.addr)).await?;
        startups.dispatcher_ms.push(first_202(&mut fleet).await?);
        fleet.enqueue_many(0..BACKLOG, 16).await?;
        let before = receiver.count();
        let started = Instant::now();
        fleet.spawn_worker()?;
        wait_until(Duration::from_secs(30), || receiver.count() > before).await?;
        startups.worker_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        wait_until(Duration::from_secs(60), || receiver.count() >= before + BACKLOG).await?;
        fleet.stop(conn).await;
    }
    Ok(startups)
}

/// Stops the fleet's dispatcher and starts another on its address: ms from its start to its first
/// 202, asking every millisecond.
async fn first_202(fleet: &mut BenchFleet) -> anyhow::Result<f64> {
    let _ = fleet.dispatcher.kill();
    let _ = fleet.dispatcher.wait();
    let port = fleet.api.rsplit(':').next().unwrap_or_default().to_string();
    let mut cmd = fleet.command("dispatcher");
    cmd.env("FLEET_HTTP_ADDR", format!("127.0.0.1:{port}"));
    let body = json!({"tool_name": "bench", "parameters": {"query": "startup"}, "room_id": "room_1"});
    let started = Instant::now();
    fleet.dispatcher = cmd.spawn()?;
    loop {
        let sent = fleet.http.post(format!("{}/v1/tool-calls", fleet.api)).bearer_auth(&fleet.token).json(&body).send();
        if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(5), sent).await {
            if r.status().as_u16() == 202 {
                return Ok(started.elapsed().as_secs_f64() * 1000.0);
            }
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "no 202 within 30 s of the dispatcher's start");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

pub(super) fn print(s: &Startups) {
    let spread = |v: &[f64]| v.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(", ");
    let worst = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    for (figure, times) in [
        ("startup: a dispatcher's start to its first 202", &s.dispatcher_ms),
        ("startup: a worker's start to its first job, a backlog waiting", &s.worker_ms),
    ] {
        row(
            &format!("{figure}, median (ms; {})", spread(times)),
            format!("{:.0}", median(times.clone())),
            "<= 100 ms",
            format!("worst {:.0}", worst(times)),
        );
    }
}
