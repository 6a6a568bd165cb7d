//! Part 8: what seed 002's reach costs. An MCP tool call beside an HTTP callback to an equivalent
//! tool (the Rust SDK's server answering `lookup_order` as cheaply as the bench's receiver
//! answers): each a drain of the same backlog of tool calls, measured from the first call reaching
//! its tool to the last, rounds of the two taking turns on fleets of their own. And the time an
//! approval pause adds to a turn when the decision is already there: a turn whose one tool call
//! needs approval, decided the moment its `approval_request` reaches the session's stream, beside
//! the same turn calling the same tool without one, taking turns.

use std::time::{Duration, Instant};

use lapin::Connection;
use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::rust_mcp::{RustMcpServer, TOOL};

use super::{cpu_seconds, median, read_frames, row, wait_until, BenchFleet, Receiver, SECRET};

/// The rounds of each drain; each variant's figure is its median.
const ROUNDS: usize = 3;

/// Each drain's rounds: jobs/s, and the workers' CPU per job (µs) from the first call to the last.
pub(super) struct ReachDrains {
    callback: Vec<(f64, f64)>,
    mcp: Vec<(f64, f64)>,
}

/// The two drains, `jobs` calls each, `ROUNDS` times, taking turns.
pub(super) async fn mcp_beside_callback(
    conn: &Connection,
    jobs: usize,
    workers: usize,
    concurrency: usize,
) -> anyhow::Result<ReachDrains> {
    let receiver = Receiver::start(Duration::ZERO).await;
    let server = RustMcpServer::start().await?;
    let env = [("FLEET_WORKER_CONCURRENCY", concurrency.to_string()), ("FLEET_LIGHT_LANE_CALL_RATE", "0".into())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut drains = ReachDrains { callback: vec![], mcp: vec![] };
    for _ in 0..ROUNDS {
        let mut fleet = BenchFleet::start(&env).await?;
        fleet.register(&format!("http://{}/reach", receiver.addr)).await?;
        let before = receiver.count();
        enqueue(&fleet, "bench", jobs, |i| json!({"query": "benchmark payload", "n": i})).await?;
        let rate = drain(&mut fleet, workers, || receiver.count() - before, jobs).await?;
        drains.callback.push(rate);
        fleet.stop(conn).await;

        let mut fleet = BenchFleet::start(&env).await?;
        register_server(&fleet, &server.url).await?;
        let before = server.calls() as usize;
        enqueue(&fleet, &format!("orders.{TOOL}"), jobs, |i| json!({"order_id": format!("o-{i}")})).await?;
        let rate = drain(&mut fleet, workers, || server.calls() as usize - before, jobs).await?;
        drains.mcp.push(rate);
        fleet.stop(conn).await;
    }
    server.stop().await;
    Ok(drains)
}

async fn register_server(fleet: &BenchFleet, url: &str) -> anyhow::Result<()> {
    let body = json!({"name": "orders", "url": url});
    let r =
        fleet.http.post(format!("{}/v1/mcp_servers", fleet.api)).bearer_auth(&fleet.token).json(&body).send().await?;
    anyhow::ensure!(r.status().as_u16() == 201, "register the MCP server: {} {}", r.status(), r.text().await?);
    Ok(())
}

/// `jobs` calls of `tool`, in batches of 1,000, before any worker runs.
pub(super) async fn enqueue(
    fleet: &BenchFleet,
    tool: &str,
    jobs: usize,
    parameters: impl Fn(usize) -> Value,
) -> anyhow::Result<()> {
    for start in (0..jobs).step_by(1000) {
        let calls: Vec<Value> = (start..jobs.min(start + 1000))
            .map(|i| json!({"tool_name": tool, "parameters": parameters(i), "room_id": "room_1"}))
            .collect();
        let url = format!("{}/v1/tool-calls/batch", fleet.api);
        let r = fleet.http.post(url).bearer_auth(&fleet.token).json(&json!({"calls": calls})).send().await?;
        anyhow::ensure!(r.status().is_success(), "enqueue a batch of {tool}: {} {}", r.status(), r.text().await?);
    }
    Ok(())
}

/// Starts the workers on the backlog: jobs/s from the first call reaching its tool to the last,
/// and the workers' CPU per job (µs) meanwhile: the fleet's own cost of a call, whatever the tool's.
async fn drain(
    fleet: &mut BenchFleet,
    workers: usize,
    reached: impl Fn() -> usize,
    jobs: usize,
) -> anyhow::Result<(f64, f64)> {
    for _ in 0..workers {
        fleet.spawn_worker()?;
    }
    let cpu = |fleet: &BenchFleet| fleet.workers.iter().map(|w| cpu_seconds(w.id())).sum::<f64>();
    wait_until(Duration::from_secs(60), || reached() >= 1).await?;
    let (first, cpu_first) = (Instant::now(), cpu(fleet));
    wait_until(Duration::from_secs(600), || reached() >= jobs).await?;
    let per_job_us = 1e6 * (cpu(fleet) - cpu_first) / (jobs - 1) as f64;
    Ok(((jobs - 1) as f64 / first.elapsed().as_secs_f64(), per_job_us))
}

/// The fleet's time per turn (ms, its model calls' time left out) with an approval decided at
/// once and without one, `turns` of each, taking turns.
pub(super) async fn approval_pause(conn: &Connection, turns: usize) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let llm = MockLlm::start(|body, _| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        if messages.last().is_some_and(|m| m["role"] == "tool") {
            return LlmReply::text("done");
        }
        let tool = if body.to_string().contains("MODE:approval") { "guarded" } else { "bench" };
        LlmReply::ToolCalls(vec![("call_1".into(), tool.into(), r#"{"q":1}"#.into())])
    })
    .await;
    let receiver = Receiver::start(Duration::ZERO).await;
    let base = llm.base_url();
    let mut fleet = BenchFleet::start(&[("FLEET_LLM_BASE_URL", &base)]).await?;
    fleet.add_worker().await?;
    let url = format!("http://{}/reach", receiver.addr);
    fleet.register(&url).await?;
    let guarded = json!({"description": "bench", "parameters": {"type": "object"}, "callback_url": url,
        "callback_secret": SECRET, "requires_approval": true});
    let r = fleet
        .http
        .put(format!("{}/v1/tools/guarded", fleet.api))
        .bearer_auth(&fleet.token)
        .json(&guarded)
        .send()
        .await?;
    anyhow::ensure!(r.status().is_success(), "register the guarded tool: {}", r.status());
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for n in 0..turns {
        for approval in [false, true] {
            let before = llm.requests().len();
            let (mode, tool) = if approval { ("approval", "guarded") } else { ("plain", "bench") };
            let elapsed = one_turn(&fleet, &format!("reach_{approval}_{n}"), mode, tool).await?;
            let model: Duration =
                llm.requests()[before..].iter().map(|r| r.ended.unwrap_or(r.started) - r.started).sum();
            let ms = elapsed.saturating_sub(model).as_secs_f64() * 1000.0;
            if approval {
                with.push(ms)
            } else {
                without.push(ms)
            }
        }
    }
    fleet.stop(conn).await;
    Ok((with, without))
}

/// One turn enabling `tool` (its instructions `MODE:{mode}`, for the model to read) from its POST to
/// its `done` on the session's stream, approving a call the moment the stream asks.
pub(super) async fn one_turn(fleet: &BenchFleet, session: &str, mode: &str, tool: &str) -> anyhow::Result<Duration> {
    let body = json!({"session_id": session, "assistant": {"id": "a", "instructions": format!("MODE:{mode}"),
        "model_config": {"model": "m"}, "enabled_tools": [tool]}, "messages": [{"role": "user", "content": "go"}]});
    let mut frames = fleet.open_stream(session).await?.bytes_stream();
    let t0 = Instant::now();
    let r = fleet.http.post(format!("{}/v1/turns", fleet.api)).bearer_auth(&fleet.token).json(&body).send().await?;
    anyhow::ensure!(r.status().as_u16() == 202, "a turn answered {}", r.status());
    loop {
        let seen = read_frames(&mut frames, |frame| {
            if frame.contains("event: done\n") {
                return Some(None);
            }
            let data: Value = frame
                .lines()
                .find_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .and_then(|d| serde_json::from_str(d).ok())?;
            (data["type"] == "approval_request").then(|| data["approval_id"].as_str().map(str::to_string))
        })
        .await?;
        let Some(id) = seen else { return Ok(t0.elapsed()) };
        let decision = json!({"decision": "approve", "reason": "bench"});
        let url = format!("{}/v1/approvals/{id}", fleet.api);
        let r = fleet.http.post(url).bearer_auth(&fleet.token).json(&decision).send().await?;
        anyhow::ensure!(r.status().is_success(), "approve {id}: {}", r.status());
    }
}

/// The rows: each drain's median and its rounds, their ratio; the approval pause's median.
pub(super) fn print(drains: &ReachDrains, (with, without): (Vec<f64>, Vec<f64>)) {
    let spread = |v: &[f64]| v.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(", ");
    let rates = |d: &[(f64, f64)]| d.iter().map(|(r, _)| *r).collect::<Vec<_>>();
    let cpus = |d: &[(f64, f64)]| d.iter().map(|(_, c)| *c).collect::<Vec<_>>();
    let (callback, mcp) = (median(rates(&drains.callback)), median(rates(&drains.mcp)));
    let rounds = format!("{} rounds", drains.callback.len());
    let label = format!("reach: HTTP callback drain (jobs/s; {rounds}: {})", spread(&rates(&drains.callback)));
    row(&label, format!("{callback:.0}"), "", "".into());
    row(
        &format!("reach: MCP tools/call drain (jobs/s; {rounds}: {})", spread(&rates(&drains.mcp))),
        format!("{mcp:.0}"),
        ">= 1/1.3 of the callback's",
        format!("{:.2}×", mcp / callback),
    );
    let (callback_cpu, mcp_cpu) = (median(cpus(&drains.callback)), median(cpus(&drains.mcp)));
    let label = format!("reach: workers' CPU per callback (µs; {})", spread(&cpus(&drains.callback)));
    row(&label, format!("{callback_cpu:.0}"), "", "".into());
    row(
        &format!("reach: workers' CPU per MCP call (µs; {})", spread(&cpus(&drains.mcp))),
        format!("{mcp_cpu:.0}"),
        "<= 1.3× the callback's",
        format!("{:.2}×", mcp_cpu / callback_cpu),
    );
    let (with, without) = (median(with), median(without));
    row("reach: a turn calling a tool, fleet's time, median (ms)", format!("{without:.2}"), "", "".into());
    row("reach: the same turn, its call approved at once, median (ms)", format!("{with:.2}"), "", "".into());
    row(
        "reach: an approval pause adds, decision there, median (ms)",
        format!("{:.2}", with - without),
        "<= 2 ms",
        "".into(),
    );
}
