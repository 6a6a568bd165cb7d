//! Copies of a turn's step that arrive while the step waits before its model call: in its
//! provider's fair line (parked, the budget has no room), waiting for one of its tenant's turn
//! slots, and holding one. Whatever the moment, the model is called once for the step, the turn
//! finishes once with one answer, every copy ends as a counted duplicate, the line and the
//! semaphore keep no place or slot for it afterwards, and nothing is left in the queues.
//!
//! A copy arriving while the step is parked carries the step the record expects, as the parked
//! delivery does; but the record is marked with the park (the parked delivery's id and when it is
//! due back), so the copy is only acked, counted as a duplicate on arrival: it takes no claim,
//! asks for no place and is not parked again. The same holds for a tool call deferred by its
//! tool's `max_concurrency`. A copy arriving while the step holds its claim is parked until the
//! lease ends (`FLEET_CLAIM_LEASE` is short here, so they are counted soon).
//!
//! The same holds for the steps of seed 001's agents (the last part of this file): each step of a
//! turn that hands off between steps, the steps around a client tool's call, and an agent's step
//! parked in the fair line or holding its tenant's slot.

use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use serde_json::{json, Value};

use fleet_protocol::envelope::JobKind;
use fleet_protocol::keys::Keys;
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::tap::{JobTap, Tapped};
use fleet_tests::turn::{llm_fleet, post_turn, send_agent_input, session_events, turn_body};
use fleet_tests::{metric, spawn_fleet, wait_for, Fleet, FleetOptions, Receiver, Reply};

/// How many copies of the step each test publishes.
const COPIES: usize = 3;
const WORKERS: usize = 2;
const TENANT: &str = "acme";
const SECRET: &str = "whsec_step_copies_secret_01";

fn tenant_turn(session: &str, text: &str) -> Value {
    let mut body = turn_body(session, text, &[]);
    body["tenant"] = json!(TENANT);
    body
}

/// The sum over the fleet's workers of one series.
async fn summed(fleet: &Fleet, series: &str) -> f64 {
    let mut total = 0.0;
    for index in 0..WORKERS {
        total += metric(&fleet.worker_metrics(index).await, series);
    }
    total
}

const TURN_DUPLICATES: &str = "fleet_duplicate_deliveries_total{kind=\"turn\"}";

async fn duplicates(fleet: &Fleet) -> f64 {
    summed(fleet, TURN_DUPLICATES).await
}

/// Messages ready in each of `queues`, read over one connection.
async fn depths(fleet: &Fleet, queues: &[String]) -> Vec<u32> {
    let (conn, channel) = fleet.amqp().await;
    let mut out = Vec::new();
    for queue in queues {
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        let q = channel.queue_declare(queue.as_str().into(), passive, FieldTable::default()).await.unwrap();
        out.push(q.message_count());
    }
    let _ = conn.close(200, "".into()).await;
    out
}

/// The turns' delay queues (retries and parks).
fn turn_delay_queues(fleet: &Fleet) -> Vec<String> {
    let mark = format!(".delay.{}.", JobKind::Turn.queue_suffix());
    fleet.topology.queues().into_iter().map(|q| q.name).filter(|n| n.contains(&mark)).collect()
}

/// Waits until `deliveries` copies of the step sit parked in a delay queue at once: each found the
/// step's claim held (a live lease) and was parked until the lease ends.
async fn wait_all_parked(fleet: &Fleet, deliveries: u32) {
    let delays = turn_delay_queues(fleet);
    wait_for("the step and its copies all parked", Duration::from_secs(30), || async {
        let parked: u32 = depths(fleet, &delays).await.iter().sum();
        assert!(parked <= deliveries, "{parked} deliveries parked, of {deliveries}");
        (parked == deliveries).then_some(())
    })
    .await;
}

/// Waits until `copies` copies were counted as duplicates, then checks that `still_waiting` holds:
/// the copies were acked on arrival, while their step was still parked.
async fn wait_copies_acked_while_parked(fleet: &Fleet, series: &str, copies: usize, still_waiting: impl Fn() -> bool) {
    let started = std::time::Instant::now();
    wait_for("every copy acked", Duration::from_secs(30), || async {
        (summed(fleet, series).await >= copies as f64).then_some(())
    })
    .await;
    println!("{copies} copies counted as duplicates {:?} after they were published", started.elapsed());
    assert!(still_waiting(), "the copies were acked only after their step ran, not on arrival");
}

/// Waits until no queue of the fleet holds a message and no worker runs a job.
async fn wait_drained(fleet: &Fleet) {
    let queues: Vec<String> = fleet.topology.queues().into_iter().map(|q| q.name).collect();
    wait_for("the queues drained", Duration::from_secs(60), || async {
        let held: u32 = depths(fleet, &queues).await.iter().sum();
        let mut running = 0.0;
        for index in 0..WORKERS {
            let text = fleet.worker_metrics(index).await;
            running += text
                .lines()
                .filter(|l| l.starts_with("fleet_jobs_in_flight{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
        }
        (held == 0 && running == 0.0).then_some(())
    })
    .await;
}

async fn zcard(fleet: &Fleet, key: &str) -> i64 {
    redis::cmd("ZCARD").arg(key).query_async(&mut fleet.redis().await).await.unwrap()
}

async fn hlen(fleet: &Fleet, key: &str) -> i64 {
    redis::cmd("HLEN").arg(key).query_async(&mut fleet.redis().await).await.unwrap()
}

/// Waits until the step of execution `id` is parked: its record carries the marker a copy of the
/// step is acked by. (In a line is not yet parked: until its claim is given back and its park
/// published and marked, a copy finds the claim held, and waits for the lease.)
async fn wait_marked_parked(fleet: &Fleet, id: &str) {
    let record = Keys::new(fleet.key_prefix.clone()).execution(id);
    wait_for("the step parked, its record marked", Duration::from_secs(20), || async {
        let marker: Option<String> =
            redis::cmd("HGET").arg(&record).arg("parked_step").query_async(&mut fleet.redis().await).await.unwrap();
        marker.is_some_and(|m| !m.is_empty()).then_some(())
    })
    .await;
}

async fn members(fleet: &Fleet, key: &str) -> Vec<String> {
    redis::cmd("ZRANGE").arg(key).arg(0).arg(-1).query_async(&mut fleet.redis().await).await.unwrap()
}

/// The model calls whose conversation carries `marker`.
fn calls_with(llm: &MockLlm, marker: &str) -> usize {
    llm.requests().iter().filter(|r| r.contents().iter().any(|c| c == marker)).count()
}

/// The turn ended once: succeeded with one attempt per model call (a park spends none), one
/// answer in its session's history, one `message_complete` and one `done` in its stream.
async fn assert_finished_once(fleet: &Fleet, id: &str, session: &str, asked: &str, answer: &str, calls: usize) {
    let record = fleet.wait_status(id, "succeeded", Duration::from_secs(60)).await;
    assert_eq!(record["attempts"].as_array().map(Vec::len), Some(calls), "one attempt per call: {record}");
    let (status, listed) = fleet.get(&format!("/v1/sessions/{session}/messages?order=asc")).await;
    assert_eq!(status, 200, "{listed}");
    let history: Vec<(String, String)> = listed["data"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] != "tool" && m["content"].as_str().is_some_and(|c| !c.is_empty()))
        .map(|m| (m["role"].as_str().unwrap().to_string(), m["content"].as_str().unwrap().to_string()))
        .collect();
    let expected = [("user".to_string(), asked.to_string()), ("assistant".to_string(), answer.to_string())];
    assert_eq!(history, expected, "one answer in the history");
    let types = event_types(fleet, session).await;
    let count = |t: &str| types.iter().filter(|x| *x == t).count();
    assert_eq!((count("message_complete"), count("done")), (1, 1), "one finish streamed: {types:?}");
}

async fn event_types(fleet: &Fleet, session: &str) -> Vec<String> {
    let events = session_events(fleet, session).await;
    events.iter().map(|e| e["type"].as_str().unwrap_or_default().to_string()).collect()
}

/// The provider's line keeps nothing of a step that ran: no place, waiter, deadline or cost.
async fn assert_line_empty(fleet: &Fleet) {
    let keys = Keys::new(fleet.key_prefix.clone());
    for key in [
        keys.llm_budget_line("openai"),
        keys.llm_budget_waiters("openai"),
        keys.llm_budget_places("openai"),
        keys.llm_budget_seen("openai"),
    ] {
        assert_eq!(zcard(fleet, &key).await, 0, "{key} still holds {:?}", members(fleet, &key).await);
    }
    let costs = keys.llm_budget_costs("openai");
    assert_eq!(hlen(fleet, &costs).await, 0, "{costs} still holds a waiting step's cost");
}

/// How often the fleet parked a step before its model call, by the provider's budget and by its
/// The tenant's turn slots after all is done: no slot held, no turn in its line, no deadline kept.
async fn assert_tenant_slots_free(fleet: &Fleet, tenant: &str) {
    let keys = Keys::new(fleet.key_prefix.clone());
    let (semaphore, (line, due)) = (keys.tenant_turns(tenant), keys.tenant_turns_line(tenant));
    assert_eq!(zcard(fleet, &semaphore).await, 0, "no slot held: {:?}", members(fleet, &semaphore).await);
    assert_eq!(zcard(fleet, &line).await, 0, "no turn in the tenant's line: {:?}", members(fleet, &line).await);
    assert_eq!(hlen(fleet, &due).await, 0, "no deadline kept for a turn in line");
}

/// tenant's slots.
async fn parks(fleet: &Fleet) -> (f64, f64) {
    let mut out = (0.0, 0.0);
    for index in 0..WORKERS {
        let text = fleet.worker_metrics(index).await;
        let sum = |name: &str, label: &str| -> f64 {
            text.lines()
                .filter(|l| l.starts_with(name) && l.contains(label))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        out.0 += sum("fleet_llm_budget_parked_total{", "reason=\"budget\"");
        out.1 += sum("fleet_tenant_turns_parked_total{", "reason=\"concurrency\"");
    }
    out
}

/// Publishes `COPIES` copies of the step's first delivery.
async fn inject(tap: &JobTap, step: &Tapped) {
    for _ in 0..COPIES {
        tap.republish(step).await;
    }
}

/// Every copy ended as a counted duplicate (the worker's own `duplicate` and `copy` outcomes agree).
async fn assert_copies_counted(fleet: &Fleet, copies: usize) {
    let copies = copies as f64;
    wait_for("every copy counted", Duration::from_secs(30), || async {
        (duplicates(fleet).await >= copies).then_some(())
    })
    .await;
    wait_drained(fleet).await;
    let seen = duplicates(fleet).await;
    let finished = summed(fleet, "fleet_jobs_finished_total{kind=\"turn\",outcome=\"duplicate\"}").await
        + summed(fleet, "fleet_jobs_finished_total{kind=\"turn\",outcome=\"copy\"}").await;
    let (budget, slots) = parks(fleet).await;
    println!(
        "copies injected {copies}, counted as duplicates {seen}, finished as duplicate or copy {finished}; \
         parks by the budget {budget}, by the tenant's slots {slots}"
    );
    assert_eq!(seen, copies, "each copy counted once, nothing else");
}

/// The last user message a model call was asked.
fn asked(body: &Value) -> String {
    body["messages"].as_array().unwrap().last().unwrap()["content"].as_str().unwrap_or("").to_string()
}

/// The steps waiting in a provider's line (its waiters are named `tenant|order|step`).
async fn waiting_steps(fleet: &Fleet, waiters: &str) -> Vec<String> {
    members(fleet, waiters).await.iter().map(|m| m.splitn(3, '|').nth(2).unwrap_or(m).to_string()).collect()
}

/// A first turn takes the budget's burst; the second's step (`{session}_waiting`, asking
/// "waiting") waits in the line (`waiters`), and copies of it, injected then, are acked while it
/// still waits, leaving one waiter. The second turn's id.
async fn copies_while_second_turn_waits_in_line(
    fleet: &Fleet,
    tap: &JobTap,
    llm: &MockLlm,
    waiters: &str,
    session: &str,
) -> String {
    let first = post_turn(fleet, &tenant_turn(&format!("{session}_first"), "first")).await;
    fleet.wait_status(&first, "succeeded", Duration::from_secs(30)).await;
    let waiting = post_turn(fleet, &tenant_turn(&format!("{session}_waiting"), "waiting")).await;
    let mine = format!("{waiting}:0:0:1");
    wait_for("the step waiting in the line", Duration::from_secs(20), || async {
        waiting_steps(fleet, waiters).await.contains(&mine).then_some(())
    })
    .await;
    wait_marked_parked(fleet, &waiting).await;
    let step = tap.first("the step's delivery", |t| t.execution_id() == waiting).await;

    inject(tap, &step).await;
    wait_copies_acked_while_parked(fleet, TURN_DUPLICATES, COPIES, || calls_with(llm, "waiting") == 0).await;
    assert_eq!(waiting_steps(fleet, waiters).await, vec![mine], "one waiter for the step and its copies");
    waiting
}

/// Copies of a step parked in its provider's fair line. 12 requests a minute with 5 s of burst:
/// the first turn's call takes the burst, the second turn's step waits about 5 s in the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_a_step_waiting_in_the_budgets_line_call_the_model_once() {
    let llm = MockLlm::start(|body, _| {
        let asked = asked(body);
        LlmReply::text(&format!("answer to {asked}"))
    })
    .await;
    let options = llm_fleet(&llm)
        .workers(WORKERS)
        .env("FLEET_CLAIM_LEASE", "3")
        .env("FLEET_LLM_BUDGET", r#"{"requests_per_minute": 12, "burst_seconds": 5}"#);
    let fleet = spawn_fleet(options).await;
    let tap = JobTap::start(&fleet).await;
    let keys = Keys::new(fleet.key_prefix.clone());
    let (line, waiters) = (keys.llm_budget_line("openai"), keys.llm_budget_waiters("openai"));

    let waiting = copies_while_second_turn_waits_in_line(&fleet, &tap, &llm, &waiters, "s_line").await;
    assert_eq!(zcard(&fleet, &line).await, 1, "one place in the line");

    assert_finished_once(&fleet, &waiting, "s_line_waiting", "waiting", "answer to waiting", 1).await;
    assert_copies_counted(&fleet, COPIES).await;
    assert_eq!(calls_with(&llm, "waiting"), 1, "one model call for the step");
    assert_eq!(llm.requests().len(), 2, "one model call per turn");
    assert_line_empty(&fleet).await;
}

/// Both limits at once: the step takes its tenant's one slot, finds no room in the budget, gives
/// the slot back and is parked in the line (its claim is given back before its slot). Copies
/// arriving meanwhile must neither hold the slot nor take a second place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_a_step_parked_by_the_budget_under_a_tenant_cap_call_the_model_once() {
    let llm = MockLlm::start(|body, _| {
        let asked = asked(body);
        LlmReply::text(&format!("answer to {asked}"))
    })
    .await;
    let options = llm_fleet(&llm)
        .workers(WORKERS)
        .env("FLEET_CLAIM_LEASE", "3")
        .env("FLEET_TENANT_MAX_CONCURRENT_TURNS", &format!("{TENANT}=1"))
        .env("FLEET_LLM_BUDGET", r#"{"requests_per_minute": 12, "burst_seconds": 5}"#);
    let fleet = spawn_fleet(options).await;
    let tap = JobTap::start(&fleet).await;
    let keys = Keys::new(fleet.key_prefix.clone());
    let waiters = keys.llm_budget_waiters("openai");
    let semaphore = keys.tenant_turns(TENANT);

    let waiting = copies_while_second_turn_waits_in_line(&fleet, &tap, &llm, &waiters, "s_both").await;
    let holders = members(&fleet, &semaphore).await;
    assert!(holders.iter().all(|h| h.starts_with(&waiting)) && holders.len() <= 1, "slots held: {holders:?}");

    assert_finished_once(&fleet, &waiting, "s_both_waiting", "waiting", "answer to waiting", 1).await;
    assert_copies_counted(&fleet, COPIES).await;
    assert_eq!(calls_with(&llm, "waiting"), 1, "one model call for the step");
    assert_eq!(llm.requests().len(), 2, "one model call per turn");
    assert_line_empty(&fleet).await;
    assert_tenant_slots_free(&fleet, TENANT).await;
}

/// A turn of two steps: the first calls a tool, the second waits in the line (the first took the
/// burst). Copies of the second step, and a late copy of the first, arrive while it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_a_later_step_waiting_in_the_budgets_line_call_the_model_once() {
    let llm = MockLlm::start(|body, _| {
        let messages = body["messages"].as_array().unwrap();
        if messages.iter().any(|m| m["role"] == "tool") {
            LlmReply::text("answer after the tool")
        } else {
            LlmReply::ToolCalls(vec![("call_1".into(), "lookup".into(), r#"{"query":"q"}"#.into())])
        }
    })
    .await;
    let receiver = Receiver::start(SECRET, |_, _| Reply::result(json!("looked up"))).await;
    let options = llm_fleet(&llm)
        .workers(WORKERS)
        .env("FLEET_CLAIM_LEASE", "3")
        .env("FLEET_LLM_BUDGET", r#"{"requests_per_minute": 12, "burst_seconds": 5}"#);
    let fleet = spawn_fleet(options).await;
    fleet.register_tool("lookup", &receiver.url("/lookup"), SECRET).await;
    let tap = JobTap::start(&fleet).await;
    let keys = Keys::new(fleet.key_prefix.clone());
    let (line, waiters) = (keys.llm_budget_line("openai"), keys.llm_budget_waiters("openai"));

    let mut body = tenant_turn("s_line_rounds", "look it up");
    body["assistant"]["enabled_tools"] = json!(["lookup"]);
    let id = post_turn(&fleet, &body).await;
    let mine = format!("{id}:0:1:1");
    wait_for("the second step waiting in the line", Duration::from_secs(20), || async {
        waiting_steps(&fleet, &waiters).await.contains(&mine).then_some(())
    })
    .await;
    wait_marked_parked(&fleet, &id).await;
    let is_step = |t: &Tapped, round: u64| t.execution_id() == id && t.kind() == "turn" && t.json["round"] == round;
    let first = tap.first("the first step's delivery", |t| is_step(t, 0)).await;
    let second = tap.first("the second step's delivery", |t| is_step(t, 1)).await;

    inject(&tap, &second).await;
    tap.republish(&first).await;
    wait_copies_acked_while_parked(&fleet, TURN_DUPLICATES, COPIES + 1, || llm.requests().len() == 1).await;
    assert_eq!(waiting_steps(&fleet, &waiters).await, vec![mine.clone()], "one waiter for the step and its copies");
    assert_eq!(zcard(&fleet, &line).await, 1, "one place in the line");

    assert_finished_once(&fleet, &id, "s_line_rounds", "look it up", "answer after the tool", 2).await;
    assert_copies_counted(&fleet, COPIES + 1).await;
    assert_eq!(llm.requests().len(), 2, "one model call per step");
    assert_eq!(receiver.received().len(), 1, "the tool was called once");
    assert_line_empty(&fleet).await;
}

/// One turn slot for the tenant, held by a slow first turn; the second turn's step waits for it,
/// parked; its copies arrive meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_a_step_waiting_for_its_tenants_slot_call_the_model_once() {
    let llm = MockLlm::start(|body, _| {
        let asked = asked(body);
        let reply = LlmReply::text(&format!("answer to {asked}"));
        if asked == "slow" {
            reply.after(Duration::from_secs(6))
        } else {
            reply
        }
    })
    .await;
    let options = llm_fleet(&llm)
        .workers(WORKERS)
        .env("FLEET_CLAIM_LEASE", "3")
        .env("FLEET_TENANT_MAX_CONCURRENT_TURNS", &format!("{TENANT}=1"));
    let fleet = spawn_fleet(options).await;
    let tap = JobTap::start(&fleet).await;
    let keys = Keys::new(fleet.key_prefix.clone());
    let semaphore = keys.tenant_turns(TENANT);
    let (line, _) = keys.tenant_turns_line(TENANT);

    let slow = post_turn(&fleet, &tenant_turn("s_slot_slow", "slow")).await;
    wait_for("the slow turn's model call", Duration::from_secs(20), || async {
        (calls_with(&llm, "slow") == 1).then_some(())
    })
    .await;
    let waiting = post_turn(&fleet, &tenant_turn("s_slot_waiting", "waiting")).await;
    wait_for("the step waiting for a slot", Duration::from_secs(20), || async {
        members(&fleet, &line).await.contains(&waiting).then_some(())
    })
    .await;
    wait_marked_parked(&fleet, &waiting).await;
    let step = tap.first("the step's delivery", |t| t.execution_id() == waiting).await;

    inject(&tap, &step).await;
    wait_copies_acked_while_parked(&fleet, TURN_DUPLICATES, COPIES, || calls_with(&llm, "waiting") == 0).await;
    assert!(llm.requests()[0].ended.is_none(), "the slow turn still held the slot");
    assert_eq!(members(&fleet, &line).await, vec![waiting.clone()], "one place in the tenant's line");
    let holders = members(&fleet, &semaphore).await;
    assert!(holders.len() == 1 && holders[0].starts_with(&slow), "only the slow turn holds a slot: {holders:?}");

    fleet.wait_status(&slow, "succeeded", Duration::from_secs(30)).await;
    assert_finished_once(&fleet, &waiting, "s_slot_waiting", "waiting", "answer to waiting", 1).await;
    assert_copies_counted(&fleet, COPIES).await;
    assert_eq!((calls_with(&llm, "slow"), calls_with(&llm, "waiting")), (1, 1), "one model call per step");
    assert_tenant_slots_free(&fleet, TENANT).await;
}

/// The step holds its tenant's one slot and is in its model call when its copies arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_a_step_holding_its_tenants_slot_call_the_model_once() {
    let llm = MockLlm::start(|body, _| {
        let asked = asked(body);
        LlmReply::text(&format!("answer to {asked}")).after(Duration::from_secs(4))
    })
    .await;
    let options: FleetOptions = llm_fleet(&llm)
        .workers(WORKERS)
        .env("FLEET_CLAIM_LEASE", "3")
        .env("FLEET_TENANT_MAX_CONCURRENT_TURNS", &format!("{TENANT}=1"));
    let fleet = spawn_fleet(options).await;
    let tap = JobTap::start(&fleet).await;
    let keys = Keys::new(fleet.key_prefix.clone());
    let semaphore = keys.tenant_turns(TENANT);

    let holding = post_turn(&fleet, &tenant_turn("s_slot_holding", "holding")).await;
    wait_for("the step's model call", Duration::from_secs(20), || async {
        (calls_with(&llm, "holding") == 1).then_some(())
    })
    .await;
    let step = tap.first("the step's delivery", |t| t.execution_id() == holding).await;

    inject(&tap, &step).await;
    wait_all_parked(&fleet, COPIES as u32).await;
    assert!(llm.requests()[0].ended.is_none(), "the copies arrived while the step held its slot");
    let holders = members(&fleet, &semaphore).await;
    assert!(holders.len() == 1 && holders[0].starts_with(&holding), "one slot, the step's: {holders:?}");

    assert_finished_once(&fleet, &holding, "s_slot_holding", "holding", "answer to holding", 1).await;
    assert_copies_counted(&fleet, COPIES).await;
    assert_eq!(calls_with(&llm, "holding"), 1, "one model call for the step");
    assert_tenant_slots_free(&fleet, TENANT).await;
}

/// How often the fleet deferred a call of `one_at_a_time` by its concurrency.
async fn deferrals(fleet: &Fleet) -> f64 {
    let mut total = 0.0;
    for index in 0..WORKERS {
        let text = fleet.worker_metrics(index).await;
        total += text
            .lines()
            .filter(|l| l.starts_with("fleet_tool_deferred_total{"))
            .filter(|l| l.contains("tool=\"one_at_a_time\"") && l.contains("reason=\"concurrency\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    total
}

/// A tool of `max_concurrency` 1 whose first call is slow: the second call is deferred by the
/// limit (its claim given back, parked) while the first holds the slot, and its copies arrive
/// meanwhile. Each copy is acked on arrival; the call is sent once when the slot frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_a_call_deferred_by_its_tools_concurrency_are_only_acked() {
    let receiver = Receiver::start(SECRET, |r, _| {
        let reply = Reply::result(json!("done"));
        if r.json.to_string().contains("\"slow\"") {
            reply.after(Duration::from_secs(6))
        } else {
            reply
        }
    })
    .await;
    let fleet = spawn_fleet(FleetOptions::default().workers(WORKERS).env("FLEET_CLAIM_LEASE", "3")).await;
    let body = json!({
        "description": "a tool of one call at a time",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        "callback_url": receiver.url("/one"),
        "callback_secret": SECRET,
        "max_concurrency": 1,
    });
    let (status, resp) = fleet.request(reqwest::Method::PUT, "/v1/tools/one_at_a_time", Some(&body)).await;
    assert_eq!(status, 201, "{resp}");
    let tap = JobTap::start(&fleet).await;

    let slow = fleet.call_tool("one_at_a_time", json!({"query": "slow"})).await;
    wait_for("the slow call sent", Duration::from_secs(20), || async {
        (!receiver.received_for(&slow).is_empty()).then_some(())
    })
    .await;
    let waiting = fleet.call_tool("one_at_a_time", json!({"query": "waiting"})).await;
    wait_for("the call deferred by the limit", Duration::from_secs(20), || async {
        (deferrals(&fleet).await >= 1.0).then_some(())
    })
    .await;
    let call = tap.first("the call's delivery", |t| t.execution_id() == waiting).await;

    inject(&tap, &call).await;
    let duplicates = "fleet_duplicate_deliveries_total{kind=\"tool_call\"}";
    wait_copies_acked_while_parked(&fleet, duplicates, COPIES, || receiver.received_for(&waiting).is_empty()).await;

    for id in [&slow, &waiting] {
        let record = fleet.wait_status(id, "succeeded", Duration::from_secs(60)).await;
        assert_eq!(record["attempts"].as_array().map(Vec::len), Some(1), "{id}: {record}");
        assert_eq!(receiver.received_for(id).len(), 1, "{id} was sent once");
    }
    wait_drained(&fleet).await;
    let (seen, parks) = (summed(&fleet, duplicates).await, deferrals(&fleet).await);
    println!("copies injected {COPIES}, counted as duplicates {seen}; deferrals by the tool's concurrency {parks}");
    assert_eq!(seen, COPIES as f64, "each copy counted once, nothing else");
    assert_eq!(receiver.max_concurrent(), 1, "one call at a time");
}

// ---- Seed 001's agents: steps that hand off, client tools ----
//
// The same copies, of the steps of an agent's turn. A handoff (`transition_to_step`) is answered
// in its round's own save, and a client tool's call is answered by the client's `tool_output`,
// whose dispatcher publishes the next step: a copy of any of these steps, wherever it arrives,
// must neither hand off again, nor announce the pending call again, nor answer twice.
// A tool configuration's call (`copies_of_a_configured_calls_jobs_are_only_acked`): copies of the
// step that made it, of its tool-call job while the tool runs, and of the step after, must send
// the call once, overridden once.

/// The agents' token: unbound, so its turns are its name's tenant (`token-` and the first four
/// bytes of its SHA-256, in hex), which a tenant's turn cap can name before the fleet starts.
const AGENT_TOKEN: &str = "step-copies-agent-0123456789ab";

fn agent_tenant() -> String {
    use sha2::Digest;
    format!("token-{}", hex::encode(&sha2::Sha256::digest(AGENT_TOKEN.as_bytes())[..4]))
}

/// A fleet for agents' turns: `options` with the agents' token.
async fn agent_fleet(options: FleetOptions) -> Fleet {
    let mut fleet = spawn_fleet(options.workers(WORKERS).env("FLEET_CLAIM_LEASE", "3").env("FLEET_API_TOKENS", AGENT_TOKEN)).await;
    fleet.token = AGENT_TOKEN.to_string();
    fleet
}

/// An agent in two steps: triage hands off to billing, which answers.
async fn create_stepped_agent(fleet: &Fleet, tools: &[&str]) {
    let mut body = fleet_tests::agent_events::two_step_agent("stepped", "You are helpful.");
    body["enabled_tools"] = json!(tools);
    let (status, resp) = fleet.post("/v1/agents/assistants", &body).await;
    assert_eq!(status, 201, "{resp}");
}

/// The step a model call was made in, by its system prompt.
fn step_of(body: &Value) -> &'static str {
    let system = body["messages"][0]["content"].as_str().unwrap_or_default();
    if system.contains("Current step: triage") {
        "triage"
    } else if system.contains("Current step: billing") {
        "billing"
    } else {
        "none"
    }
}

/// Triage hands off to billing; billing answers "settled" (after `billing_takes`).
fn handoff_model(billing_takes: Duration) -> impl Fn(&Value, usize) -> LlmReply + Send + Sync + 'static {
    move |body, _| {
        let answered = body["messages"].as_array().unwrap().last().is_some_and(|m| m["role"] == "tool");
        if step_of(body) == "triage" && !answered {
            let arguments = json!({"step_name": "billing", "handoff_message": "over to billing"}).to_string();
            return LlmReply::ToolCalls(vec![("call_1".into(), "transition_to_step".into(), arguments)]);
        }
        LlmReply::text("settled").after(billing_takes)
    }
}

/// The delivery of round `round` of turn `id`.
async fn round_delivery(tap: &JobTap, id: &str, round: u64) -> Tapped {
    tap.first("the step's delivery", |t| t.execution_id() == id && t.kind() == "turn" && t.json["round"] == round).await
}

/// The model calls per step.
fn calls_per_step(llm: &MockLlm) -> Vec<&'static str> {
    llm.requests().iter().map(|r| step_of(&r.body)).collect()
}

/// The agent's turn ended once: succeeded, and its session's stream holds each of `once` once,
/// with one answer and one end.
async fn assert_agent_finished_once(fleet: &Fleet, id: &str, session: &str, once: &[&str]) {
    fleet.wait_status(id, "succeeded", Duration::from_secs(60)).await;
    let types = event_types(fleet, session).await;
    let count = |t: &str| types.iter().filter(|x| *x == t).count();
    for kind in once.iter().chain(&["message_complete", "done"]) {
        assert_eq!(count(kind), 1, "one {kind}: {types:?}");
    }
}

/// A stepped agent's turn hands off in its first round and answers in its second. Copies of the
/// first step arrive late (the record expects the second), copies of the second while it holds its
/// claim in its model call (parked until the lease ends), and one more of each after the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_each_step_of_an_agents_handoff_are_only_acked() {
    let llm = MockLlm::start(handoff_model(Duration::from_secs(3))).await;
    let fleet = agent_fleet(llm_fleet(&llm)).await;
    create_stepped_agent(&fleet, &[]).await;
    let tap = JobTap::start(&fleet).await;

    let id = send_agent_input(&fleet, "stepped", "s_agent_handoff", "my bill").await;
    wait_for("billing's model call", Duration::from_secs(20), || async {
        (calls_per_step(&llm) == ["triage", "billing"]).then_some(())
    })
    .await;
    let (first, second) = (round_delivery(&tap, &id, 0).await, round_delivery(&tap, &id, 1).await);
    inject(&tap, &first).await;
    inject(&tap, &second).await;
    assert!(llm.requests()[1].ended.is_none(), "the copies arrived while billing's call ran");

    assert_agent_finished_once(&fleet, &id, "s_agent_handoff", &["step_transition"]).await;
    tap.republish(&first).await;
    tap.republish(&second).await;
    assert_copies_counted(&fleet, 2 * COPIES + 2).await;
    assert_eq!(calls_per_step(&llm), ["triage", "billing"], "the model was called once per round");
    assert_agent_finished_once(&fleet, &id, "s_agent_handoff", &["step_transition"]).await;
}

/// A client tool's turn: its first step announces the pending call and the turn waits for the
/// client; copies of that step arrive while it waits. The client's answer publishes the second
/// step; copies of it arrive while it holds its claim, and one of each after the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_a_client_tools_steps_are_only_acked() {
    let llm = MockLlm::start(|body, _| {
        let answered = body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool");
        if step_of(body) == "triage" && !answered {
            return LlmReply::ToolCalls(vec![("call_1".into(), "get_location".into(), "{}".into())]);
        }
        LlmReply::text("you are in Oslo").after(Duration::from_secs(3))
    })
    .await;
    let fleet = agent_fleet(llm_fleet(&llm)).await;
    let tool = json!({"description": "on the device", "execution": "client", "parameters": {"type": "object"}});
    let (status, resp) = fleet.request(reqwest::Method::PUT, "/v1/tools/get_location", Some(&tool)).await;
    assert_eq!(status, 201, "{resp}");
    create_stepped_agent(&fleet, &["get_location"]).await;
    let tap = JobTap::start(&fleet).await;
    let session = "s_agent_client_tool";

    let id = send_agent_input(&fleet, "stepped", session, "where am I?").await;
    let pending = wait_for("the call pending with the client", Duration::from_secs(20), || async {
        let events = session_events(&fleet, session).await;
        events.into_iter().find(|e| e["type"] == "client_tool_pending")
    })
    .await;
    let first = round_delivery(&tap, &id, 0).await;
    inject(&tap, &first).await;
    wait_copies_acked_while_parked(&fleet, TURN_DUPLICATES, COPIES, || llm.requests().len() == 1).await;

    let event_id = pending["pending_calls"][0]["event_id"].clone();
    let answer = json!({"type": "tool_output", "tool_outputs": [{"event_id": event_id, "type": "success", "output": {"city": "Oslo"}}]});
    let path = format!("/v2/agents/stepped/sessions/{session}/events");
    let sent = fleet.http.post(format!("{}{path}", fleet.api)).bearer_auth(&fleet.token);
    let sent = sent.header("Request-Timeout-Millis", "50").json(&answer).send().await.unwrap();
    assert_eq!(sent.status().as_u16(), 201);
    wait_for("the second step's model call", Duration::from_secs(20), || async {
        (llm.requests().len() == 2).then_some(())
    })
    .await;
    let second = round_delivery(&tap, &id, 1).await;
    inject(&tap, &second).await;

    let once = ["tool_call", "client_tool_pending", "tool_result"];
    assert_agent_finished_once(&fleet, &id, session, &once).await;
    tap.republish(&first).await;
    tap.republish(&second).await;
    assert_copies_counted(&fleet, 2 * COPIES + 2).await;
    assert_eq!(llm.requests().len(), 2, "one model call per step");
    assert_agent_finished_once(&fleet, &id, session, &once).await;
}

/// A configured call: its overrides (a secret, a literal) are resolved at the job's attempt. Copies
/// of the step that made the call arrive late, copies of the call's job while its tool runs, and
/// copies of the answering step while it holds its claim; then one more of each after the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_a_configured_calls_jobs_are_only_acked() {
    const KEY: &str = "sk-copies-configured-5e1d";
    let llm = MockLlm::start(|body, _| {
        let answered = body["messages"].as_array().unwrap().last().is_some_and(|m| m["role"] == "tool");
        if !answered {
            return LlmReply::ToolCalls(vec![("call_1".into(), "crm_lookup".into(), r#"{"query":"q"}"#.into())]);
        }
        LlmReply::text("found").after(Duration::from_secs(3))
    })
    .await;
    let fleet = agent_fleet(llm_fleet(&llm)).await;
    let crm = Receiver::start(SECRET, |_, _| Reply::result(json!({"id": "rec-1"})).after(Duration::from_secs(2))).await;
    fleet.register_tool("crm", &crm.url("/crm"), SECRET).await;
    let agent = json!({"name": "configured", "title": "CRM", "instructions": "Use the CRM.", "secrets": {"key": KEY},
        "tool_configurations": {"crm_lookup": {"tool_name": "crm", "argument_overrides": {
            "auth.key": {"$ref": "secrets.key"}, "region": "eu"}}}});
    let (status, resp) = fleet.post("/v1/agents/assistants", &agent).await;
    assert_eq!(status, 201, "{resp}");
    let tap = JobTap::start(&fleet).await;
    let session = "s_agent_configured";

    let id = send_agent_input(&fleet, "configured", session, "look it up").await;
    let call = tap.first("the configured call's job", |t| t.kind() == "tool_call").await;
    let first = round_delivery(&tap, &id, 0).await;
    inject(&tap, &first).await;
    inject(&tap, &call).await;
    wait_for("the answering step's model call", Duration::from_secs(20), || async {
        (llm.requests().len() == 2).then_some(())
    })
    .await;
    let second = round_delivery(&tap, &id, 1).await;
    inject(&tap, &second).await;

    let once = ["tool_call", "tool_result"];
    assert_agent_finished_once(&fleet, &id, session, &once).await;
    tap.republish(&first).await;
    tap.republish(&call).await;
    tap.republish(&second).await;
    assert_copies_counted(&fleet, 2 * COPIES + 2).await;
    assert_eq!(llm.requests().len(), 2, "one model call per step");
    let sent = crm.received();
    assert_eq!(sent.len(), 1, "the call was sent once: {sent:?}");
    assert_eq!(sent[0].json["parameters"], json!({"query": "q", "region": "eu", "auth": {"key": KEY}}));
    assert_agent_finished_once(&fleet, &id, session, &once).await;
}

/// The step after a handoff waits in its provider's fair line (the first round took the burst);
/// copies of it, and a late copy of the first round, arrive while it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_an_agents_step_waiting_in_the_budgets_line_call_the_model_once() {
    let llm = MockLlm::start(handoff_model(Duration::ZERO)).await;
    let options = llm_fleet(&llm).env("FLEET_LLM_BUDGET", r#"{"requests_per_minute": 12, "burst_seconds": 5}"#);
    let fleet = agent_fleet(options).await;
    create_stepped_agent(&fleet, &[]).await;
    let tap = JobTap::start(&fleet).await;
    let keys = Keys::new(fleet.key_prefix.clone());
    let (line, waiters) = (keys.llm_budget_line("openai"), keys.llm_budget_waiters("openai"));

    let id = send_agent_input(&fleet, "stepped", "s_agent_line", "my bill").await;
    let mine = format!("{id}:0:1:1");
    wait_for("billing's step waiting in the line", Duration::from_secs(20), || async {
        waiting_steps(&fleet, &waiters).await.contains(&mine).then_some(())
    })
    .await;
    wait_marked_parked(&fleet, &id).await;
    let (first, second) = (round_delivery(&tap, &id, 0).await, round_delivery(&tap, &id, 1).await);
    inject(&tap, &second).await;
    tap.republish(&first).await;
    wait_copies_acked_while_parked(&fleet, TURN_DUPLICATES, COPIES + 1, || llm.requests().len() == 1).await;
    assert_eq!(waiting_steps(&fleet, &waiters).await, vec![mine], "one waiter for the step and its copies");
    assert_eq!(zcard(&fleet, &line).await, 1, "one place in the line");

    assert_agent_finished_once(&fleet, &id, "s_agent_line", &["step_transition"]).await;
    assert_copies_counted(&fleet, COPIES + 1).await;
    assert_eq!(calls_per_step(&llm), ["triage", "billing"], "one model call per step");
    assert_line_empty(&fleet).await;
}

/// The step after a handoff holds its tenant's one turn slot, in its model call, when its copies
/// arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_of_an_agents_step_holding_its_tenants_slot_call_the_model_once() {
    let llm = MockLlm::start(handoff_model(Duration::from_secs(4))).await;
    let tenant = agent_tenant();
    let options = llm_fleet(&llm).env("FLEET_TENANT_MAX_CONCURRENT_TURNS", &format!("{tenant}=1"));
    let fleet = agent_fleet(options).await;
    create_stepped_agent(&fleet, &[]).await;
    let tap = JobTap::start(&fleet).await;
    let semaphore = Keys::new(fleet.key_prefix.clone()).tenant_turns(&tenant);

    let id = send_agent_input(&fleet, "stepped", "s_agent_slot", "my bill").await;
    wait_for("billing's model call", Duration::from_secs(20), || async {
        (calls_per_step(&llm) == ["triage", "billing"]).then_some(())
    })
    .await;
    let second = round_delivery(&tap, &id, 1).await;
    inject(&tap, &second).await;
    wait_all_parked(&fleet, COPIES as u32).await;
    assert!(llm.requests()[1].ended.is_none(), "the copies arrived while the step held its slot");
    let holders = members(&fleet, &semaphore).await;
    assert!(holders.len() == 1 && holders[0].starts_with(&id), "one slot, the step's: {holders:?}");

    assert_agent_finished_once(&fleet, &id, "s_agent_slot", &["step_transition"]).await;
    assert_copies_counted(&fleet, COPIES).await;
    assert_eq!(calls_per_step(&llm), ["triage", "billing"], "one model call per step");
    assert_tenant_slots_free(&fleet, &tenant).await;
}
