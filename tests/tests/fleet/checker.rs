//! The exactly-once checker: a steady load of tool calls (the default schedule, a tool's own,
//! receivers failing then succeeding, 202s polled from the broker, a tool that fails for good),
//! agent turns (two rounds of two parallel tool calls, steers, a webhook subscriber) and seed 001
//! agents' turns (a handoff between steps, then the answer) while a tap re-publishes random copies
//! of random jobs at random moments. Copies at chosen moments of an agent's steps (a handoff, a
//! client tool's call, a step parked in the fair line or holding a tenant's slot) are
//! `step_copies`' cases. In the soak
//! (`FLEET_CHECKER_SCALE`, `make soak`) workers are also SIGKILLed and restarted.
//!
//! It counts POSTs per execution at the receivers (each schedule fixes how many there must be),
//! model requests per (turn, model call) at the stub model, and webhook deliveries per event; it
//! checks that every execution ends and every session is free. Printed: jobs, copies injected,
//! effects doubled (0), lost (0), sessions stuck (0).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::tap::JobTap;
use fleet_tests::turn::{post_turn, send_agent_input, session_events};
use fleet_tests::{spawn_fleet, wait_for, Fleet, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_checker_secret_0001";

/// How many POSTs each tool's executions must see, whatever copies arrive.
const SCHEDULED_POSTS: [(&str, usize); 5] = [("ok", 1), ("flaky", 2), ("own", 3), ("poll", 1), ("broken", 1)];

fn tool_receiver() -> impl Fn(&fleet_tests::receiver::Received, usize) -> Reply + Send + Sync + 'static {
    |r, n| {
        let path = r.path.as_str();
        let id = r.execution_id();
        match path {
            "/ok" | "/turn" => Reply::result(json!({"echo": r.json["parameters"]["query"]})),
            "/flaky" if n == 0 => Reply::status(500),
            "/own" if n < 2 => Reply::status(503),
            "/flaky" | "/own" => Reply::result(json!("recovered")),
            "/poll" => Reply {
                status: 202,
                body: json!({"status_url": format!("/status/{id}")}).to_string(),
                delay: Duration::ZERO,
                headers: vec![],
            },
            // Pending for two polls, then done (the POST counts as the first request).
            p if p.starts_with("/status/") && n < 3 => {
                Reply { status: 202, body: r#"{"status":"pending"}"#.into(), delay: Duration::ZERO, headers: vec![] }
            }
            p if p.starts_with("/status/") => Reply::result(json!("polled")),
            "/broken" => Reply::status(400),
            _ => Reply::status(200), // webhook deliveries
        }
    }
}

/// The stub model: every turn makes two rounds of two parallel calls, then answers. Requests are
/// counted per (turn, model call): the turn by its instructions, the call by how many tool results
/// and user messages it saw (a steer adds a user message).
struct Model;

/// Which model call a request is: the turn (its instructions), the tool results and user messages
/// it saw (a steer adds one).
fn model_call(body: &Value) -> (String, usize, usize) {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let instructions = messages.iter().find(|m| m["role"] == "system").map(|m| m["content"].to_string());
    let tools = messages.iter().filter(|m| m["role"] == "tool").count();
    let users = messages.iter().filter(|m| m["role"] == "user").count();
    (instructions.unwrap_or_default(), tools, users)
}

impl Model {
    fn reply(&self, body: &Value) -> LlmReply {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        // A seed 001 agent's turn: triage hands off to billing, which answers.
        let system = messages.first().and_then(|m| m["content"].as_str()).unwrap_or_default();
        if system.contains("Current step: triage") {
            let arguments = json!({"step_name": "billing", "handoff_message": "over to billing"}).to_string();
            return LlmReply::ToolCalls(vec![("call_h".into(), "transition_to_step".into(), arguments)])
                .after(Duration::from_millis(50));
        }
        if system.contains("Current step: billing") {
            return LlmReply::text("billed").after(Duration::from_millis(50));
        }
        let tools = messages.iter().filter(|m| m["role"] == "tool").count();
        // Rounds of this turn's own: its tool results since its last user message.
        let since_user =
            messages.iter().rev().take_while(|m| m["role"] != "user").filter(|m| m["role"] == "tool").count();
        if since_user >= 4 || messages.last().is_some_and(|m| m["role"] == "user") && tools >= 4 {
            return LlmReply::text("all done");
        }
        let round = since_user / 2;
        let calls = (0..2)
            .map(|i| {
                (
                    format!("call_{round}_{i}"),
                    "lookup".to_string(),
                    json!({"query": format!("r{round}c{i}")}).to_string(),
                )
            })
            .collect();
        LlmReply::ToolCalls(calls).after(Duration::from_millis(50))
    }
}

/// Of effects that happened at `times` (one effect's repeats, in order) where `allowed` were due,
/// how many repeats no worker's death explains: a repeat is explained by a SIGKILL between it and
/// the one before (the worker died after sending and before recording).
fn unexplained(mut times: Vec<Instant>, allowed: usize, kills: &[Instant]) -> usize {
    times.sort();
    times
        .windows(2)
        .skip(allowed.saturating_sub(1))
        .filter(|pair| !kills.iter().any(|k| *k >= pair[0] && *k <= pair[1]))
        .count()
}

/// Re-publishes random tapped jobs after random delays, until stopped; counts what it injected.
fn inject_copies(
    tap: Arc<JobTap>,
    injected: Arc<AtomicUsize>,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut seen = 0;
        let mut copies = tokio::task::JoinSet::new();
        while !stop.is_cancelled() {
            let all = tap.seen().await;
            for job in all.into_iter().skip(seen) {
                seen += 1;
                let roll = uuid::Uuid::new_v4().as_u128();
                // About one job in three is copied, at a moment up to 3 s later.
                if !roll.is_multiple_of(3) {
                    continue;
                }
                let delay = Duration::from_millis((roll >> 8) as u64 % 3000);
                let (tap, injected) = (tap.clone(), injected.clone());
                copies.spawn(async move {
                    tokio::time::sleep(delay).await;
                    tap.republish(&job).await;
                    injected.fetch_add(1, Ordering::SeqCst);
                });
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = stop.cancelled() => {}
            }
        }
        while copies.join_next().await.is_some() {}
    })
}

async fn register(fleet: &Fleet, receiver: &Receiver) {
    for (name, _) in SCHEDULED_POSTS {
        fleet.register_tool(name, &receiver.url(&format!("/{name}")), SECRET).await;
    }
    fleet.register_tool("lookup", &receiver.url("/turn"), SECRET).await;
    // `own`: a schedule of its own, three attempts a second apart.
    let own = json!({"name": "own", "description": "its own schedule", "parameters": {"type": "object"},
        "callback_url": receiver.url("/own"), "callback_secret": SECRET, "retry": {"attempts": 3, "delays": [1, 1]}});
    let (status, body) = fleet.request(reqwest::Method::PUT, "/v1/tools/own", Some(&own)).await;
    assert_eq!(status, 200, "{body}");
    let hook = json!({"url": receiver.url("/events"), "secret": SECRET, "events": ["agent.room.message", "tool.callback.dead_letter"]});
    let (status, body) = fleet.request(reqwest::Method::PUT, "/v1/webhooks/checker", Some(&hook)).await;
    assert_eq!(status, 201, "{body}");
}

fn turn(session: &str, name: &str, text: &str, steer: bool) -> Value {
    let mut body = json!({
        "session_id": session,
        "assistant": {"id": "asst_checker", "instructions": format!("You are {name}."),
            "model_config": {"provider": "openai", "model": "test-model"}, "enabled_tools": ["lookup"]},
        "messages": [{"role": "user", "content": text}]
    });
    if steer {
        body["behavior"] = json!("steer");
    }
    body
}

/// Seed 001's agent `n`: triage hands off to billing (its own instructions, so its model calls
/// are told from every other turn's). Its name.
async fn stepped_agent(fleet: &Fleet, n: usize) -> String {
    let name = format!("checker_agent_{n}");
    let mut body = fleet_tests::agent_events::two_step_agent(&name, &format!("You are A{n}."));
    body["model_config"] = json!({"provider": "openai", "model": "test-model"});
    let (status, resp) = fleet.post("/v1/agents/assistants", &body).await;
    assert_eq!(status, 201, "{resp}");
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_any_job_at_any_moment_change_nothing() {
    let scale: usize = std::env::var("FLEET_CHECKER_SCALE").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let kills = scale > 1;
    let receiver = Receiver::start(SECRET, tool_receiver()).await;
    let model = Arc::new(Model);
    let llm = MockLlm::start({
        let model = model.clone();
        move |body, _| model.reply(body)
    })
    .await;
    let options = FleetOptions::default()
        .workers(2)
        .env("FLEET_LLM_BASE_URL", &llm.base_url())
        .env("FLEET_LLM_API_KEY", "sk-test")
        .env("FLEET_RETRY_DELAYS", "0.3,0.6,1.2,2.4,4.8")
        .env("FLEET_ASYNC_POLL_INTERVAL", "0.3")
        .env("FLEET_CLAIM_LEASE", "2")
        .env("FLEET_LLM_DEFAULT_MODEL", "test-model");
    let mut fleet = spawn_fleet(options).await;
    register(&fleet, &receiver).await;
    let tap = Arc::new(JobTap::start(&fleet).await);
    let injected = Arc::new(AtomicUsize::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let injector = inject_copies(tap.clone(), injected.clone(), stop.clone());
    let started = Instant::now();

    // The load: calls of every kind, and turns with steers, offered over a few seconds.
    let (mut calls, mut turns) = (Vec::new(), Vec::new());
    let mut alive = vec![0, 1];
    let mut killed_at = Vec::new();
    for n in 0..(6 * scale) {
        for (tool, _) in SCHEDULED_POSTS {
            let id = fleet.call_tool(tool, json!({"query": format!("{tool}-{n}")})).await;
            calls.push((tool, id));
        }
        let session = format!("s_checker_{n}");
        turns.push(post_turn(&fleet, &turn(&session, &format!("T{n}"), &format!("T{n} start"), false)).await);
        if n % 2 == 0 {
            turns.push(post_turn(&fleet, &turn(&session, &format!("S{n}"), &format!("S{n} steer"), true)).await);
        }
        let agent = stepped_agent(&fleet, n).await;
        turns.push(send_agent_input(&fleet, &agent, &format!("s_checker_agent_{n}"), &format!("A{n} bill")).await);
        if kills && n % 3 == 2 {
            fleet.kill_worker(alive.remove(0));
            killed_at.push(Instant::now());
            alive.push(fleet.spawn_worker().await);
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }

    let all: Vec<String> = calls.iter().map(|(_, id)| id.clone()).chain(turns.iter().cloned()).collect();
    let finals = wait_for("every execution to end", Duration::from_secs(240), || statuses_final(&fleet, &all)).await;
    // Copies still in flight must find nothing to do either.
    stop.cancel();
    injector.await.unwrap();
    settle_copies(&fleet, &alive).await;

    let lost = finals.values().filter(|s| s.as_str() != "succeeded" && s.as_str() != "dead_lettered").count();
    // Effects beyond what the schedules allow, each unexplained by a worker's death (none die
    // outside the soak): POSTs per call, model requests per model call, deliveries per event.
    let mut doubled = 0;
    let mut repeats: HashMap<(String, usize, usize), Vec<Instant>> = HashMap::new();
    for request in llm.requests() {
        repeats.entry(model_call(&request.body)).or_default().push(request.started);
    }
    doubled += repeats.values().map(|times| unexplained(times.clone(), 1, &killed_at)).sum::<usize>();
    for (tool, id) in &calls {
        let expected = SCHEDULED_POSTS.iter().find(|(t, _)| t == tool).unwrap().1;
        let posts: Vec<Instant> =
            receiver.received_for(id).iter().filter(|r| r.path == format!("/{tool}")).map(|r| r.at).collect();
        assert!(!posts.is_empty(), "{tool} {id} was never sent");
        let extra = unexplained(posts.clone(), expected, &killed_at);
        if extra > 0 {
            eprintln!("{tool} {id}: {} POSTs where its schedule makes {expected}", posts.len());
        }
        doubled += extra;
    }
    let mut deliveries: HashMap<(String, String), Vec<Instant>> = HashMap::new();
    for r in receiver.received().into_iter().filter(|r| r.path == "/turn" || r.path == "/events") {
        deliveries.entry((r.path.clone(), r.execution_id().to_string())).or_default().push(r.at);
    }
    for ((path, id), times) in &deliveries {
        let extra = unexplained(times.clone(), 1, &killed_at);
        if extra > 0 {
            eprintln!("{path} {id}: {} deliveries", times.len());
        }
        doubled += extra;
    }
    if killed_at.is_empty() {
        doubled += agent_events_doubled(&fleet, 6 * scale).await;
    }
    let resent = llm.requests().len() + receiver.received().len();
    let stuck = stuck_sessions(&fleet).await;
    let broken_dead = calls.iter().filter(|(t, id)| *t == "broken" && finals[id] == "dead_lettered").count();
    println!(
        "checker: {} jobs ({} tool calls, {} turns), {} copies injected, {} workers SIGKILLed, effects doubled: {doubled}, lost: {lost}, sessions stuck: {stuck}, in {:.1} s ({resent} requests to the model and receivers)",
        all.len(),
        calls.len(),
        turns.len(),
        injected.load(Ordering::SeqCst),
        killed_at.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(injected.load(Ordering::SeqCst) > all.len() / 2, "copies were injected");
    assert_eq!(doubled, 0, "effects doubled");
    assert_eq!(lost, 0, "executions that did not end");
    assert_eq!(stuck, 0, "sessions left locked or with turns in line");
    assert_eq!(broken_dead, 6 * scale, "the broken tool's calls are dead letters, and stay so");
    for (tool, id) in calls.iter().filter(|(t, _)| *t != "broken") {
        assert_eq!(finals[id], "succeeded", "{tool} {id}");
    }
}

/// Events beyond one handoff and one answer in the sessions of `agents` agents' turns. (In the
/// soak, a worker's death may explain a repeated event, as it does a repeated model call: only the
/// model calls are counted there.)
async fn agent_events_doubled(fleet: &Fleet, agents: usize) -> usize {
    let mut doubled = 0;
    for n in 0..agents {
        let events = session_events(fleet, &format!("s_checker_agent_{n}")).await;
        let count = |t: &str| events.iter().filter(|e| e["type"] == t).count();
        let (handoffs, answers) = (count("step_transition"), count("message_complete"));
        if (handoffs, answers) != (1, 1) {
            eprintln!("agent {n}: {handoffs} handoffs and {answers} answers");
            doubled += (handoffs + answers).saturating_sub(2);
        }
    }
    doubled
}

/// Every execution's status once all of them are final (`None` until then).
async fn statuses_final(fleet: &Fleet, ids: &[String]) -> Option<HashMap<String, String>> {
    let statuses: Vec<(String, String)> = futures::stream::iter(ids.iter().cloned())
        .map(|id| async move {
            let (_, body) = fleet.get(&format!("/v1/executions/{id}")).await;
            (id, body["data"]["status"].as_str().unwrap_or("missing").to_string())
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let done = |s: &str| matches!(s, "succeeded" | "dead_lettered" | "cancelled" | "failed");
    statuses.iter().all(|(_, s)| done(s)).then(|| statuses.into_iter().collect())
}

/// Waits until the work queues hold nothing and no job runs: the last copies have been handled.
async fn settle_copies(fleet: &Fleet, workers: &[usize]) {
    use fleet_protocol::envelope::JobKind;
    wait_for("the last copies handled", Duration::from_secs(60), || async {
        let mut idle = true;
        for kind in JobKind::ALL {
            idle &= fleet.waiting_depth(kind).await == 0;
        }
        for worker in workers {
            let text = fleet.worker_metrics(*worker).await;
            idle &= !text.lines().any(|l| l.starts_with("fleet_jobs_in_flight") && !l.ends_with(" 0"));
        }
        idle.then_some(())
    })
    .await;
}

/// Sessions whose lock is still held or whose line still holds turns.
async fn stuck_sessions(fleet: &Fleet) -> usize {
    let mut con = fleet.redis().await;
    let mut stuck = 0;
    for key in fleet.redis_keys("session:*:lock").await {
        let holder: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut con).await.unwrap();
        if let Some(holder) = holder {
            eprintln!("{key} still held by {holder}");
            stuck += 1;
        }
    }
    for key in fleet.redis_keys("session:*:queue").await {
        let waiting: Vec<String> = redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).query_async(&mut con).await.unwrap();
        if !waiting.is_empty() {
            eprintln!("{key} still has {waiting:?} in line");
            stuck += 1;
        }
    }
    stuck
}
