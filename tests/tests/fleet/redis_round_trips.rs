//! What one successful tool call costs in Redis round trips, the dispatcher's and the worker's apart,
//! measured on a Redis of the test's own: `total_reads_processed` counts the requests Redis read
//! (a pipeline arrives as one), `INFO commandstats` says which commands they were (commands a Lua
//! script calls count there too).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use fleet_tests::redis_instance::RedisInstance;
use fleet_tests::{metric, spawn_fleet, wait_for, FleetOptions, Receiver};

const SECRET: &str = "whsec_round_trips_secret";
const JOBS: usize = 200;
/// The dispatcher's one trip per call (the record's creation) and the worker's two scripts, with
/// room for the occasional cache refresh or health write.
const DISPATCHER_BOUND: f64 = 1.1;
const WORKER_BOUND: f64 = 2.3;

/// Requests Redis has read so far, and calls per command.
async fn counters(admin: &mut redis::aio::MultiplexedConnection) -> (u64, BTreeMap<String, u64>) {
    let stats: String = redis::cmd("INFO").arg("stats").query_async(&mut *admin).await.unwrap();
    let reads = stats.lines().find_map(|l| l.strip_prefix("total_reads_processed:")).unwrap().trim().parse().unwrap();
    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(admin).await.unwrap();
    let calls = stats
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?.parse().ok()?;
            Some((name.to_string(), calls))
        })
        .collect();
    (reads, calls)
}

/// Round trips and commands per job between two readings, less the background (per second).
struct Spent {
    round_trips: f64,
    scripts: f64,
    per_command: Vec<String>,
}

async fn spent(
    admin: &mut redis::aio::MultiplexedConnection,
    (reads_before, before): &(u64, BTreeMap<String, u64>),
    background_per_sec: f64,
    since: std::time::Instant,
    jobs: usize,
) -> Spent {
    let (reads_after, after) = counters(admin).await;
    let background = background_per_sec * since.elapsed().as_secs_f64();
    let calls = |name: &str, map: &BTreeMap<String, u64>| map.get(name).copied().unwrap_or(0);
    let per_command = after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .filter_map(|(name, n)| {
            let spent = n - calls(name, before);
            (spent > 0).then(|| format!("{name} {:.2}", spent as f64 / jobs as f64))
        })
        .collect();
    let scripts = ["evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"]
        .iter()
        .map(|name| calls(name, &after) - calls(name, before))
        .sum::<u64>() as f64
        / jobs as f64;
    // Less the two INFO requests of the first reading and the background.
    let round_trips = ((reads_after - reads_before - 2) as f64 - background).max(0.0) / jobs as f64;
    Spent { round_trips, scripts, per_command }
}

/// The fleet's background requests per second (readiness checks, pickups, the dead-letter drain),
/// measured over an idle window (a measurement, not a wait).
async fn background(admin: &mut redis::aio::MultiplexedConnection) -> f64 {
    let (start, _) = counters(admin).await;
    let idle = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (end, _) = counters(admin).await;
    (end - start - 2) as f64 / idle.elapsed().as_secs_f64()
}

async fn finished(fleet: &fleet_tests::Fleet, n: usize) {
    // Counted on the worker's metrics, not by polling the API (which would add Redis reads).
    wait_for("every call to finish", Duration::from_secs(60), || async {
        let finished =
            metric(&fleet.worker_metrics(0).await, "fleet_jobs_finished_total{kind=\"tool_call\",outcome=\"success\"}");
        (finished >= n as f64).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successful_tool_call_costs_a_bounded_number_of_redis_round_trips() {
    let redis = RedisInstance::start(&[]).await;
    let receiver = Receiver::echo(SECRET).await;
    let mut fleet = spawn_fleet(FleetOptions::default().workers(0).env("FLEET_REDIS_URL", &redis.url())).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut admin = fleet_tests::redis_connection(&client).await;

    // The dispatcher alone: the jobs wait in the queue.
    let warm = fleet.call_tool("echo", json!({"query": "warm"})).await;
    let idle = background(&mut admin).await;
    let before = counters(&mut admin).await;
    let started = std::time::Instant::now();
    for n in 0..JOBS {
        fleet.call_tool("echo", json!({"query": format!("{n}")})).await;
    }
    let dispatcher = spent(&mut admin, &before, idle, started, JOBS).await;
    println!(
        "dispatcher: {:.2} round trips per accepted tool call; commands per call: {}",
        dispatcher.round_trips,
        dispatcher.per_command.join(", ")
    );

    // Then a worker drains them.
    fleet.spawn_worker().await;
    finished(&fleet, JOBS + 1).await;
    fleet.wait_status(&warm, "succeeded", Duration::from_secs(20)).await;
    let idle = background(&mut admin).await;
    let before = counters(&mut admin).await;
    let started = std::time::Instant::now();
    for n in 0..JOBS {
        fleet.call_tool("echo", json!({"query": format!("{n}")})).await;
    }
    finished(&fleet, 2 * JOBS + 1).await;
    let total = spent(&mut admin, &before, idle, started, JOBS).await;
    println!(
        "redis round trips per successful tool call: {:.2} (background {idle:.1}/s taken out), {:.2} scripts; commands per call (in scripts too): {}",
        total.round_trips,
        total.scripts,
        total.per_command.join(", ")
    );
    assert!(receiver.received().len() > 2 * JOBS, "every call reached the receiver");
    assert!(
        dispatcher.round_trips <= DISPATCHER_BOUND,
        "{:.2} dispatcher round trips per call",
        dispatcher.round_trips
    );
    let worker = total.round_trips - dispatcher.round_trips;
    // The claim (which marks the record running) and the result with the record and the attempt.
    let worker_scripts = total.scripts - dispatcher.scripts;
    println!("worker: {worker:.2} round trips, {worker_scripts:.2} scripts per successful tool call");
    // (Beside them: at most one endpoint-health write a second, which keeps the health view fresh.)
    assert!(worker_scripts <= 2.15, "{worker_scripts:.2} worker scripts per call");
    assert!(worker <= WORKER_BOUND, "{worker:.2} worker round trips per call");
}

/// The record's and the index's scripts go out together as one pipeline: a Redis that has
/// forgotten its scripts (a restart, `SCRIPT FLUSH`) still gets both, each loaded again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_forgot_its_scripts_still_gets_the_record_and_its_index_entry() {
    let redis = RedisInstance::start(&[]).await;
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default().workers(0).env("FLEET_REDIS_URL", &redis.url())).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    fleet.call_tool("echo", json!({"query": "loads the scripts"})).await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut admin = fleet_tests::redis_connection(&client).await;
    let () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut admin).await.unwrap();

    let id = fleet.call_tool("echo", json!({"query": "after the flush"})).await;
    let (status, record) = fleet.get(&format!("/v1/executions/{id}")).await;
    assert_eq!(status, 200, "the record was written: {record}");
    assert_eq!(record["data"]["status"], "queued", "{record}");
    let (status, listed) = fleet.get("/v1/executions?tool_name=echo").await;
    assert_eq!(status, 200, "{listed}");
    let ids: Vec<&str> = listed["data"].as_array().unwrap().iter().filter_map(|e| e["execution_id"].as_str()).collect();
    assert!(ids.contains(&id.as_str()), "the index lists {id}: {ids:?}");
}

const TURNS: usize = 20;
const TOKENS: usize = 20;
/// Today's bounds per turn (a simple turn: one model round of `TOKENS` tokens; a tool turn: a
/// round that calls one tool, its call, and a round that answers in `TOKENS` tokens), with room
/// for timing: how many tokens share a stream write depends on how fast they arrive while the
/// previous write is out. Measured: a simple turn 12.8 in the worker and 2.2 in the dispatcher, a
/// tool turn 33.9 and 3.2 (before a turn posted without a key entered its session's line beside
/// its record, not before it: 3.3 and 4.3 in the dispatcher; before a step read its state with its
/// claim and its history and steers with its session, and the dispatcher wrote a turn's record and
/// message log side by side: 18.7 and 4.4, 39.9 and 5.4; 33.9 for a simple turn before tokens were
/// batched). The dispatcher's bounds leave room for two writes sent together that Redis happens to
/// read apart, not for a trip more.
const SIMPLE_TURN_DISPATCHER_BOUND: f64 = 2.8;
const TOOL_TURN_DISPATCHER_BOUND: f64 = 3.8;
const SIMPLE_TURN_WORKER_BOUND: f64 = 19.0;
const TOOL_TURN_WORKER_BOUND: f64 = 42.0;

/// Waits until the worker finished `n` deliveries of `kind` successfully.
async fn finished_kind(fleet: &fleet_tests::Fleet, kind: &str, n: usize) {
    let series = format!("fleet_jobs_finished_total{{kind=\"{kind}\",outcome=\"success\"}}");
    wait_for("the turns to finish", Duration::from_secs(60), || async {
        (metric(&fleet.worker_metrics(0).await, &series) >= n as f64).then_some(())
    })
    .await;
}

/// Round trips per turn: posted with no worker (the dispatcher's), then posted and run (the total),
/// `steps` turn steps and `calls` tool calls finished per turn.
async fn turn_round_trips(tools: &[&str], steps: usize, calls: usize) -> (Spent, Spent) {
    use fleet_tests::llm::{LlmReply, MockLlm};
    use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
    let with_tool = !tools.is_empty();
    let llm = MockLlm::start(move |body, _| {
        let answered = body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool");
        if with_tool && !answered {
            LlmReply::ToolCalls(vec![("call_1".into(), "echo".into(), r#"{"query":"q"}"#.into())])
        } else {
            LlmReply::Text { tokens: (0..TOKENS).map(|n| format!("t{n} ")).collect(), delay: Duration::ZERO }
        }
    })
    .await;
    let redis = RedisInstance::start(&[]).await;
    let receiver = Receiver::echo(SECRET).await;
    let mut fleet = spawn_fleet(llm_fleet(&llm).workers(0).env("FLEET_REDIS_URL", &redis.url())).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut admin = fleet_tests::redis_connection(&client).await;
    let post = |round: usize, n: usize| turn_body(&format!("s_{round}_{n}"), "hi", tools);

    let idle = background(&mut admin).await;
    let before = counters(&mut admin).await;
    let started = std::time::Instant::now();
    for n in 0..TURNS {
        post_turn(&fleet, &post(0, n)).await;
    }
    let dispatcher = spent(&mut admin, &before, idle, started, TURNS).await;

    fleet.spawn_worker().await;
    finished_kind(&fleet, "turn", TURNS * steps).await;
    let idle = background(&mut admin).await;
    let before = counters(&mut admin).await;
    let started = std::time::Instant::now();
    // One turn at a time: the worker's connection would otherwise carry several turns' requests in
    // one read, and the count would no longer be the trips one turn waits for.
    for n in 0..TURNS {
        post_turn(&fleet, &post(1, n)).await;
        finished_kind(&fleet, "turn", (TURNS + n + 1) * steps).await;
        if calls > 0 {
            finished_kind(&fleet, "tool_call", (TURNS + n + 1) * calls).await;
        }
    }
    let total = spent(&mut admin, &before, idle, started, TURNS).await;
    (dispatcher, total)
}

fn report(what: &str, dispatcher: &Spent, total: &Spent) -> f64 {
    let worker = total.round_trips - dispatcher.round_trips;
    println!(
        "{what}: dispatcher {:.2} round trips per turn ({}); worker {worker:.2} round trips, {:.2} scripts per turn; all commands per turn (in scripts too): {}",
        dispatcher.round_trips,
        dispatcher.per_command.join(", "),
        total.scripts - dispatcher.scripts,
        total.per_command.join(", ")
    );
    worker
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simple_turn_costs_a_bounded_number_of_redis_round_trips() {
    let (dispatcher, total) = turn_round_trips(&[], 1, 0).await;
    let worker = report(&format!("simple turn ({TOKENS} tokens)"), &dispatcher, &total);
    let trips = dispatcher.round_trips;
    assert!(trips <= SIMPLE_TURN_DISPATCHER_BOUND, "{trips:.2} dispatcher round trips per simple turn");
    assert!(worker <= SIMPLE_TURN_WORKER_BOUND, "{worker:.2} worker round trips per simple turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_with_one_tool_call_costs_a_bounded_number_of_redis_round_trips() {
    let (dispatcher, total) = turn_round_trips(&["echo"], 2, 1).await;
    let worker = report(&format!("turn with one tool call ({TOKENS} tokens)"), &dispatcher, &total);
    let trips = dispatcher.round_trips;
    assert!(trips <= TOOL_TURN_DISPATCHER_BOUND, "{trips:.2} dispatcher round trips per turn with a tool call");
    assert!(worker <= TOOL_TURN_WORKER_BOUND, "{worker:.2} worker round trips per turn with a tool call");
}

const READS: usize = 100;

/// A client polling a turn (`GET /v1/executions/{id}`, whose answer carries the turn's summary)
/// costs the dispatcher one round trip per read: the record, its attempts and the turn's state
/// share a slot and are read together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_a_turns_execution_costs_one_round_trip() {
    use fleet_tests::llm::{LlmReply, MockLlm};
    use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
    let llm = MockLlm::start(|_, _| LlmReply::Text { tokens: vec!["Hi".into()], delay: Duration::ZERO }).await;
    let redis = RedisInstance::start(&[]).await;
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_REDIS_URL", &redis.url())).await;
    let id = post_turn(&fleet, &turn_body("s_read", "hi", &[])).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut admin = fleet_tests::redis_connection(&client).await;

    let idle = background(&mut admin).await;
    let before = counters(&mut admin).await;
    let started = std::time::Instant::now();
    for _ in 0..READS {
        let (status, read) = fleet.get(&format!("/v1/executions/{id}")).await;
        assert_eq!(status, 200, "{read}");
        assert_eq!(read["data"]["turn"]["session_id"], "s_read", "the read carries the turn's summary: {read}");
    }
    let read = spent(&mut admin, &before, idle, started, READS).await;
    println!("a turn's read: {:.2} round trips; commands per read: {}", read.round_trips, read.per_command.join(", "));
    assert!(read.round_trips <= 1.1, "{:.2} round trips per read of a turn's execution", read.round_trips);
}

/// The fleet's Redis connections send each request at once (`TCP_NODELAY`): with Nagle's
/// algorithm a request written while an earlier one on the same multiplexed connection was
/// unanswered waited for Redis's acknowledgement. Read from the processes' own sockets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleets_redis_connections_send_requests_at_once() {
    let redis = RedisInstance::start(&[]).await;
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_REDIS_URL", &redis.url())).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let id = fleet.call_tool("echo", json!({"query": "opens the connections"})).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    let port = redis.port;
    for (who, pid) in [("dispatcher", fleet.dispatcher_pid().unwrap()), ("worker", fleet.worker_pid(0))] {
        let nodelay = fleet_tests::sockets::nodelay_to(pid, port).unwrap();
        assert!(!nodelay.is_empty(), "the {who} holds a connection to Redis");
        assert!(nodelay.iter().all(|on| *on), "the {who}'s Redis connections, TCP_NODELAY: {nodelay:?}");
    }
}
