//! Part 9: what a data-source query costs through the fleet (issue 48). The seed's tables in a
//! PostgreSQL schema of the bench's own (in `fleet_ds`, `scripts/ensure-services.sh`), and one
//! query (a text parameter, three rows) run in one sitting:
//! - directly with tokio-postgres, the driver the worker uses, one at a time;
//! - through the API (`POST /v1/data-sources/{id}/query`: a tool-call job a worker runs in a
//!   read-only transaction, its rows read back), one at a time, taking turns with the direct one;
//! - as a model's tool call in a turn, beside the same turn calling a callback tool that answers at
//!   once (the fleet's time per turn, its model calls' time left out);
//! - a backlog of the source's tool calls drained by one worker (jobs/s), beside the same number of
//!   queries run directly on as many connections as the worker's pool for the source holds.
//!
//! Each round has a fleet of its own; a figure is the median of its rounds.

use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::Connection;
use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};

use super::{cpu_seconds, median, reach, row, BenchFleet, Receiver};

/// The query every path runs; `$1` is `"a"`.
const SQL: &str = "SELECT id, email, name, created_at FROM customers WHERE email > $1 ORDER BY email LIMIT 10";
const ROUNDS: usize = 3;
/// A source's pool in each worker (`limits.max_connections`' default).
const POOL: usize = 4;

/// Each round's figure, per path.
#[derive(Default)]
pub(super) struct DataFigures {
    direct_ms: Vec<f64>,
    api_ms: Vec<f64>,
    turn_query_ms: Vec<f64>,
    turn_callback_ms: Vec<f64>,
    direct_qps: Vec<f64>,
    fleet_qps: Vec<f64>,
    /// The worker's CPU per query in its drain (µs).
    fleet_cpu_us: Vec<f64>,
}

/// A schema of the bench's own holding the seed's tables, dropped at the end.
struct BenchSchema {
    name: String,
}

fn pg_config(schema: Option<&str>) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(5432).user("fleet_test").password("fleet_test_pw").dbname("fleet_ds");
    if let Some(schema) = schema {
        config.options(format!("-c search_path={schema}"));
    }
    config
}

async fn pg_client(schema: Option<&str>) -> anyhow::Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>)> {
    let (client, connection) = pg_config(schema).connect(tokio_postgres::NoTls).await?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((client, driver))
}

impl BenchSchema {
    async fn create() -> anyhow::Result<Self> {
        let name = format!("bench_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let (admin, driver) = pg_client(None).await?;
        let setup = format!("CREATE SCHEMA {name}; SET search_path TO {name}; {}", fleet_tests::seed::PG_SEED_TABLES);
        admin.batch_execute(&setup).await?;
        drop(admin);
        let _ = driver.await;
        Ok(BenchSchema { name })
    }

    async fn drop_it(self) {
        if let Ok((admin, driver)) = pg_client(None).await {
            let _ = admin.batch_execute(&format!("DROP SCHEMA {} CASCADE", self.name)).await;
            drop(admin);
            let _ = driver.await;
        }
    }
}

/// The model: the source's tool (`MODE:query`) or the callback tool, then a text answer.
fn model(body: &Value, _: usize) -> LlmReply {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    if messages.last().is_some_and(|m| m["role"] == "tool") {
        return LlmReply::text("done");
    }
    let call = if body.to_string().contains("MODE:query") {
        ("ds__bench", json!({"query": SQL, "parameters": ["a"]}))
    } else {
        ("bench", json!({"q": 1}))
    };
    LlmReply::ToolCalls(vec![("call_1".into(), call.0.into(), call.1.to_string())])
}

pub(super) async fn data_source_phase(
    conn: &Connection,
    queries: usize,
    turns: usize,
    backlog: usize,
) -> anyhow::Result<DataFigures> {
    let schema = BenchSchema::create().await?;
    let llm = MockLlm::start(model).await;
    let receiver = Receiver::start(Duration::ZERO).await;
    let mut figures = DataFigures::default();
    for _ in 0..ROUNDS {
        let base = llm.base_url();
        let mut fleet = BenchFleet::start(&[("FLEET_LLM_BASE_URL", &base)]).await?;
        fleet.add_worker().await?;
        fleet.register(&format!("http://{}/ds", receiver.addr)).await?;
        let id = register_source(&fleet, &schema.name).await?;
        let (direct, api) = latencies(&fleet, &id, &schema.name, queries).await?;
        figures.direct_ms.push(direct);
        figures.api_ms.push(api);
        let (query_turns, callback_turns) = turn_times(&fleet, &llm, turns).await?;
        figures.turn_query_ms.push(query_turns);
        figures.turn_callback_ms.push(callback_turns);
        let (rate, cpu) = drain(&mut fleet, backlog).await?;
        figures.fleet_qps.push(rate);
        figures.fleet_cpu_us.push(cpu);
        figures.direct_qps.push(direct_rate(&schema.name, backlog).await?);
        fleet.stop(conn).await;
    }
    schema.drop_it().await;
    Ok(figures)
}

async fn register_source(fleet: &BenchFleet, schema: &str) -> anyhow::Result<String> {
    let body = json!({"name": "bench", "type": "postgresql", "connection": {"host": "127.0.0.1", "port": 5432,
        "database": "fleet_ds", "username": "fleet_test", "password": "fleet_test_pw", "schema": schema}});
    let r =
        fleet.http.post(format!("{}/v1/data-sources", fleet.api)).bearer_auth(&fleet.token).json(&body).send().await?;
    anyhow::ensure!(r.status().as_u16() == 201, "register the data source: {}", r.status());
    let v: Value = r.json().await?;
    Ok(v["data"]["id"].as_str().unwrap_or_default().to_string())
}

/// The median time (ms) of a query run directly and through the API, `n` of each, taking turns.
async fn latencies(fleet: &BenchFleet, id: &str, schema: &str, n: usize) -> anyhow::Result<(f64, f64)> {
    let (client, driver) = pg_client(Some(schema)).await?;
    let url = format!("{}/v1/data-sources/{id}/query", fleet.api);
    let body = json!({"query": SQL, "parameters": ["a"]});
    let (mut direct, mut api) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t0 = Instant::now();
        let rows = client.query(SQL, &[&"a"]).await?;
        direct.push(t0.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(rows.len() == 3, "the direct query answered {} rows", rows.len());
        let t0 = Instant::now();
        let r = fleet.http.post(&url).bearer_auth(&fleet.token).json(&body).send().await?;
        anyhow::ensure!(r.status().is_success(), "the API's query answered {}", r.status());
        let v: Value = r.json().await?;
        api.push(t0.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(v["data"]["row_count"] == 3, "the API's query answered {v}");
    }
    drop(client);
    let _ = driver.await;
    Ok((median(direct), median(api)))
}

/// The fleet's median time per turn (ms, model time left out) calling the source's tool, and
/// calling the callback tool, `turns` of each, taking turns.
async fn turn_times(fleet: &BenchFleet, llm: &MockLlm, turns: usize) -> anyhow::Result<(f64, f64)> {
    let (mut query, mut callback) = (Vec::new(), Vec::new());
    for n in 0..turns {
        for (mode, tool) in [("query", "ds.bench"), ("plain", "bench")] {
            let before = llm.requests().len();
            let elapsed = reach::one_turn(fleet, &format!("ds_{mode}_{n}_{}", fleet.id), mode, tool).await?;
            let model: Duration =
                llm.requests()[before..].iter().map(|r| r.ended.unwrap_or(r.started) - r.started).sum();
            let ms = elapsed.saturating_sub(model).as_secs_f64() * 1000.0;
            if mode == "query" {
                query.push(ms)
            } else {
                callback.push(ms)
            }
        }
    }
    Ok((median(query), median(callback)))
}

/// The worker stopped, `backlog` calls of the source's tool enqueued, one new worker started:
/// jobs/s from its first finished call to its last, and its CPU per call (µs) meanwhile.
async fn drain(fleet: &mut BenchFleet, backlog: usize) -> anyhow::Result<(f64, f64)> {
    for mut worker in fleet.workers.drain(..) {
        let _ = worker.kill();
        let _ = worker.wait();
    }
    let parameters = json!({"query": SQL, "parameters": ["a"]});
    reach::enqueue(fleet, "ds.bench", backlog, |_| parameters.clone()).await?;
    let port = fleet.spawn_worker()?;
    let pid = fleet.workers.last().map(std::process::Child::id).unwrap_or_default();
    let metrics = format!("http://127.0.0.1:{port}/metrics");
    let finished = || async {
        let text = match fleet.http.get(&metrics).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let prefix = "fleet_jobs_finished_total{kind=\"tool_call\",outcome=\"";
        let (mut ok, mut other) = (0.0, 0.0);
        for line in text.lines().filter_map(|l| l.strip_prefix(prefix)) {
            let (outcome, value) = line.split_once("\"} ").unwrap_or(("", "0"));
            let value: f64 = value.trim().parse().unwrap_or(0.0);
            if outcome == "success" {
                ok += value
            } else {
                other += value
            }
        }
        (ok as usize, other as usize)
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut first = None;
    loop {
        let (ok, other) = finished().await;
        anyhow::ensure!(other == 0, "{other} of the source's calls did not succeed");
        if ok >= 1 && first.is_none() {
            first = Some((Instant::now(), ok, cpu_seconds(pid)));
        }
        if ok >= backlog {
            let (at, done, cpu) = first.unwrap_or((Instant::now(), 0, 0.0));
            let calls = (backlog - done).max(1) as f64;
            return Ok((calls / at.elapsed().as_secs_f64().max(1e-9), 1e6 * (cpu_seconds(pid) - cpu) / calls));
        }
        anyhow::ensure!(Instant::now() < deadline, "the backlog did not drain: {ok} of {backlog}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `n` queries run directly on `POOL` connections at once: queries/s.
async fn direct_rate(schema: &str, n: usize) -> anyhow::Result<f64> {
    let mut clients = Vec::new();
    for _ in 0..POOL {
        clients.push(pg_client(Some(schema)).await?);
    }
    let started = Instant::now();
    let per = n.div_ceil(POOL);
    let runs = clients.iter().map(|(client, _)| async move {
        for _ in 0..per {
            client.query(SQL, &[&"a"]).await?;
        }
        Ok::<_, tokio_postgres::Error>(())
    });
    for result in futures::stream::iter(runs).buffer_unordered(POOL).collect::<Vec<_>>().await {
        result?;
    }
    let rate = (per * POOL) as f64 / started.elapsed().as_secs_f64();
    for (client, driver) in clients {
        drop(client);
        let _ = driver.await;
    }
    Ok(rate)
}

/// The rows: each path's median over the rounds, and the two goals.
pub(super) fn print(f: &DataFigures) {
    let spread = |v: &[f64], digits: usize| v.iter().map(|r| format!("{r:.digits$}")).collect::<Vec<_>>().join(", ");
    let (direct, api) = (median(f.direct_ms.clone()), median(f.api_ms.clone()));
    row(
        &format!("data source: query run directly, median (ms; {})", spread(&f.direct_ms, 2)),
        format!("{direct:.2}"),
        "",
        "".into(),
    );
    row(
        &format!("data source: the same through the API, median (ms; {})", spread(&f.api_ms, 2)),
        format!("{api:.2}"),
        "",
        "".into(),
    );
    row("data source: the API adds, median (ms)", format!("{:.2}", api - direct), "<= 2 ms", "".into());
    let (query, callback) = (median(f.turn_query_ms.clone()), median(f.turn_callback_ms.clone()));
    row(
        &format!("data source: a turn calling a callback, fleet's time (ms; {})", spread(&f.turn_callback_ms, 2)),
        format!("{callback:.2}"),
        "",
        "".into(),
    );
    row(
        &format!("data source: a turn querying the source instead (ms; {})", spread(&f.turn_query_ms, 2)),
        format!("{query:.2}"),
        "",
        "".into(),
    );
    let (direct_qps, fleet_qps) = (median(f.direct_qps.clone()), median(f.fleet_qps.clone()));
    row(
        &format!("data source: direct, {POOL} connections (queries/s; {})", spread(&f.direct_qps, 0)),
        format!("{direct_qps:.0}"),
        "",
        "".into(),
    );
    row(
        &format!("data source: one worker's drain (queries/s; {})", spread(&f.fleet_qps, 0)),
        format!("{fleet_qps:.0}"),
        ">= 0.8× direct",
        format!("{:.2}×", fleet_qps / direct_qps),
    );
    let cpu = median(f.fleet_cpu_us.clone());
    row(
        &format!("data source: the worker's CPU per query (µs; {})", spread(&f.fleet_cpu_us, 0)),
        format!("{cpu:.0}"),
        "",
        "".into(),
    );
}
