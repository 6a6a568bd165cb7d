//! Model-provider budgets across a fleet of real processes: turns over the provider's requests per
//! minute are parked until their slot (no call over the budget, nothing lost, no attempt spent,
//! no worker slot held meanwhile), a provider's 429 pauses it for every worker, and its
//! `x-ratelimit-*` headers saying it has nothing left do the same. The provider is a scripted
//! OpenAI-compatible server that records when each call started.

use std::time::{Duration, Instant};

use futures::future::join_all;
use serde_json::json;

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
use fleet_tests::{spawn_fleet, Fleet, Receiver, Reply};

const SECRET: &str = "whsec_llm_budget_secret_01";

/// The sum over the fleet's workers of a counter's series whose labels contain every one of `labels`.
async fn counted(fleet: &Fleet, workers: usize, name: &str, labels: &[&str]) -> f64 {
    let mut total = 0.0;
    for index in 0..workers {
        let text = fleet.worker_metrics(index).await;
        let mut series = text.lines().filter(|l| l.starts_with(&format!("{name}{{")));
        let found = series.find(|l| labels.iter().all(|label| l.contains(label)));
        total += found.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0);
    }
    total
}

/// Posts one turn in each of `n` sessions named after `tag`; returns their ids.
async fn post_turns(fleet: &Fleet, tag: &str, n: usize) -> Vec<String> {
    let bodies: Vec<_> = (0..n).map(|i| turn_body(&format!("s_{tag}_{i}"), "hi", &[])).collect();
    join_all(bodies.iter().map(|body| post_turn(fleet, body))).await
}

/// Every turn succeeded on its first attempt (a park spends none).
async fn assert_first_attempts(fleet: &Fleet, ids: &[String]) {
    for id in ids {
        let record = fleet.wait_status(id, "succeeded", Duration::from_secs(60)).await;
        let attempts = record["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{id}: {record}");
        assert_eq!(attempts[0]["attempt"], 1, "{id}: {record}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_over_the_budget_wait_their_slot_holding_no_worker() {
    let llm = MockLlm::start(|_, _| LlmReply::text("fine")).await;
    let receiver = Receiver::start(SECRET, |_, _| Reply::result(json!("ok"))).await;
    // 120 requests a minute with one second of burst: two calls at once, then one every 500 ms.
    let workers = 2;
    let options = llm_fleet(&llm)
        .workers(workers)
        .env("FLEET_WORKER_CONCURRENCY", "1")
        .env("FLEET_LLM_BUDGET", r#"{"requests_per_minute": 120, "burst_seconds": 1}"#);
    let fleet = spawn_fleet(options).await;
    fleet.register_tool("quick", &receiver.url("/quick"), SECRET).await;

    let turns = 8;
    let ids = post_turns(&fleet, "paced", turns).await;
    // One slot per worker: a tool call only runs meanwhile if parked turns hold none.
    let call = fleet.call_tool("quick", json!({"query": "q"})).await;
    fleet.wait_status(&call, "succeeded", Duration::from_secs(20)).await;
    let call_done = Instant::now();
    assert_first_attempts(&fleet, &ids).await;

    let mut starts: Vec<Instant> = llm.requests().iter().map(|r| r.started).collect();
    starts.sort();
    assert_eq!(starts.len(), turns, "one model call per turn, none repeated");
    let first = starts[0];
    let offsets: Vec<f64> = starts.iter().map(|s| s.duration_since(first).as_secs_f64()).collect();
    println!("model calls at {offsets:.2?} s (120/min, burst 2)");
    for (k, offset) in offsets.iter().enumerate().skip(1) {
        // The k-th call's slot is (k - 1) × 500 ms after the first; a parked step may come back
        // up to 50 ms early.
        let earliest = (k as f64 - 1.0) * 0.5 - 0.06;
        assert!(*offset >= earliest, "call {k} at {offset:.3} s, before its slot at {earliest:.3} s");
    }
    assert!(call_done < *starts.last().unwrap(), "the tool call ran while turns were parked");
    let parked = counted(&fleet, workers, "fleet_llm_budget_parked_total", &["reason=\"budget\""]).await;
    assert!(parked >= 4.0, "turns over the budget were parked ({parked})");
    let sent = counted(&fleet, workers, "fleet_llm_budget_used_total", &["unit=\"requests\""]).await;
    assert_eq!(sent, turns as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_pauses_the_provider_for_every_worker() {
    // The first call is refused with Retry-After: 2; every other one answers.
    let llm =
        MockLlm::start(
            |_, n| {
                if n == 0 {
                    LlmReply::Status(429).header("retry-after", "2")
                } else {
                    LlmReply::text("fine")
                }
            },
        )
        .await;
    let workers = 2;
    let fleet = spawn_fleet(llm_fleet(&llm).workers(workers)).await;
    let first = post_turn(&fleet, &turn_body("s_pause_first", "hi", &[])).await;
    // The pause is stored before the 429 is counted: turns posted after this meet it.
    fleet_tests::wait_for("the 429 counted", Duration::from_secs(10), || async {
        (counted(&fleet, workers, "fleet_llm_rate_limited_total", &[]).await >= 1.0).then_some(())
    })
    .await;
    let refused = Instant::now();
    let others = post_turns(&fleet, "paused", 4).await;
    fleet.wait_status(&first, "succeeded", Duration::from_secs(30)).await;
    for id in &others {
        fleet.wait_status(id, "succeeded", Duration::from_secs(30)).await;
    }
    let requests = llm.requests();
    assert_eq!(requests.len(), 6, "the refused call, its retry, and one call per other turn");
    let ended = requests[0].ended.unwrap();
    for later in &requests[1..] {
        let after = later.started.duration_since(ended).as_secs_f64();
        assert!(after >= 1.9, "a call {after:.2} s after the 429 asked for 2 s");
    }
    let paused = counted(&fleet, workers, "fleet_llm_budget_parked_total", &["reason=\"paused\""]).await;
    assert!(paused >= 4.0, "the other turns waited out the pause in the broker ({paused})");
    let seen = counted(&fleet, workers, "fleet_llm_rate_limited_total", &[]).await;
    assert_eq!(seen, 1.0);
    println!("turns posted {:.2} s after the 429 ran after its pause", refused.elapsed().as_secs_f64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_saying_nothing_remains_is_paused_until_its_reset() {
    let llm = MockLlm::start(|_, n| {
        let reply = LlmReply::text("fine");
        if n == 0 {
            reply.header("x-ratelimit-remaining-requests", "0").header("x-ratelimit-reset-requests", "1.5s")
        } else {
            reply
        }
    })
    .await;
    let options = llm_fleet(&llm).env("FLEET_LLM_BUDGET", r#"{"requests_per_minute": 6000}"#);
    let fleet = spawn_fleet(options).await;
    let first = post_turn(&fleet, &turn_body("s_reset_first", "hi", &[])).await;
    fleet.wait_status(&first, "succeeded", Duration::from_secs(10)).await;
    let second = post_turn(&fleet, &turn_body("s_reset_second", "hi", &[])).await;
    fleet.wait_status(&second, "succeeded", Duration::from_secs(10)).await;
    let requests = llm.requests();
    let gap = requests[1].started.duration_since(requests[0].ended.unwrap()).as_secs_f64();
    assert!(gap >= 1.4, "the next call waited for the provider's reset ({gap:.2} s)");
}

/// A turn of `tenant` at `priority` whose user message is `text`.
fn tenant_turn(session: &str, text: &str, tenant: &str, priority: &str) -> serde_json::Value {
    let mut body = turn_body(session, text, &[]);
    body["tenant"] = json!(tenant);
    body["priority"] = json!(priority);
    body
}

/// When each model call whose conversation carries `marker` started, in order.
fn starts_of(llm: &MockLlm, marker: &str) -> Vec<Instant> {
    let mut starts: Vec<_> =
        llm.requests().iter().filter(|r| r.contents().iter().any(|c| c == marker)).map(|r| r.started).collect();
    starts.sort();
    starts
}

/// 600 requests a minute with two seconds of burst: a tenant alone runs 10 calls at once (half
/// the burst), then one every 100 ms.
fn fair_fleet(llm: &MockLlm) -> fleet_tests::FleetOptions {
    llm_fleet(llm).workers(2).env("FLEET_LLM_BUDGET", r#"{"requests_per_minute": 600, "burst_seconds": 2}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_arriving_behind_anothers_backlog_runs_at_once() {
    let llm = MockLlm::start(|_, _| LlmReply::text("fine")).await;
    let fleet = spawn_fleet(fair_fleet(&llm)).await;
    let bodies: Vec<_> = (0..40).map(|i| tenant_turn(&format!("s_fair_a{i}"), "from-a", "acme", "normal")).collect();
    let a_ids = join_all(bodies.iter().map(|b| post_turn(&fleet, b))).await;
    // A's burst has run and its backlog stands in line (about 3 s of the budget).
    fleet_tests::wait_for("A's burst", Duration::from_secs(20), || async {
        (starts_of(&llm, "from-a").len() >= 10).then_some(())
    })
    .await;
    let posted = Instant::now();
    let bodies: Vec<_> = (0..3).map(|i| tenant_turn(&format!("s_fair_b{i}"), "from-b", "globex", "normal")).collect();
    let b_ids = join_all(bodies.iter().map(|b| post_turn(&fleet, b))).await;
    for id in a_ids.iter().chain(&b_ids) {
        fleet.wait_status(id, "succeeded", Duration::from_secs(60)).await;
    }
    let b_last = starts_of(&llm, "from-b").last().unwrap().duration_since(posted).as_secs_f64();
    let a_last = starts_of(&llm, "from-a").last().unwrap().duration_since(posted).as_secs_f64();
    println!("after B posted: B's last call {b_last:.2} s, A's last call {a_last:.2} s");
    assert!(a_last > 1.5, "A's backlog was still waiting when B arrived ({a_last:.2} s)");
    assert!(b_last < 1.0, "B's calls waited behind A's backlog: last {b_last:.2} s after posting");
    assert_first_attempts(&fleet, &b_ids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_high_priority_turns_go_before_its_normal_ones() {
    let llm = MockLlm::start(|_, _| LlmReply::text("fine")).await;
    let fleet = spawn_fleet(fair_fleet(&llm)).await;
    let bodies: Vec<_> = (0..40).map(|i| tenant_turn(&format!("s_prio_n{i}"), "normal", "acme", "normal")).collect();
    let normal = join_all(bodies.iter().map(|b| post_turn(&fleet, b))).await;
    fleet_tests::wait_for("the burst", Duration::from_secs(20), || async {
        (starts_of(&llm, "normal").len() >= 10).then_some(())
    })
    .await;
    let bodies: Vec<_> = (0..2).map(|i| tenant_turn(&format!("s_prio_h{i}"), "high", "acme", "high")).collect();
    let high = join_all(bodies.iter().map(|b| post_turn(&fleet, b))).await;
    for id in normal.iter().chain(&high) {
        fleet.wait_status(id, "succeeded", Duration::from_secs(60)).await;
    }
    let last_high = *starts_of(&llm, "high").last().unwrap();
    let normal_after = starts_of(&llm, "normal").iter().filter(|s| **s > last_high).count();
    println!("normal calls after the last high one: {normal_after} of 40");
    assert!(
        normal_after >= 8,
        "the high turns waited behind the normal backlog ({normal_after} normal calls after them)"
    );
    let (status, resp) = fleet.post("/v1/turns", &tenant_turn("s_prio_bad", "x", "acme", "urgent")).await;
    assert_eq!(status, 422, "{resp}");
    assert!(resp.to_string().contains("priority"), "the error names the field: {resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_turns_beyond_its_cap_wait_for_a_slot() {
    let llm = MockLlm::start(|_, _| LlmReply::text("fine").after(Duration::from_millis(400))).await;
    let workers = 2;
    // Every tenant not named may run 2 turns at once; `free` is named with room to spare.
    let options = llm_fleet(&llm).workers(workers).env("FLEET_TENANT_MAX_CONCURRENT_TURNS", "*=2,free=50");
    let fleet = spawn_fleet(options).await;
    let bodies: Vec<_> = (0..6).map(|i| tenant_turn(&format!("s_cap_c{i}"), "capped", "capped", "normal")).collect();
    let capped = join_all(bodies.iter().map(|b| post_turn(&fleet, b))).await;
    let bodies: Vec<_> = (0..2).map(|i| tenant_turn(&format!("s_cap_f{i}"), "free", "free", "normal")).collect();
    let free = join_all(bodies.iter().map(|b| post_turn(&fleet, b))).await;
    assert_first_attempts(&fleet, &capped).await;
    assert_first_attempts(&fleet, &free).await;
    let requests = llm.requests();
    let spans: Vec<_> = requests
        .iter()
        .filter(|r| r.contents().iter().any(|c| c == "capped"))
        .map(|r| (r.started, r.ended.unwrap()))
        .collect();
    assert_eq!(spans.len(), 6);
    let most = spans.iter().map(|(s, _)| spans.iter().filter(|(s2, e2)| s2 <= s && e2 > s).count()).max().unwrap();
    println!("capped tenant: at most {most} calls at once");
    assert!(most <= 2, "{most} of the capped tenant's calls ran at once");
    let last_capped = spans.iter().map(|(s, _)| *s).max().unwrap();
    let free_first = *starts_of(&llm, "free").first().unwrap();
    assert!(free_first < last_capped, "the other tenant's turns waited behind the capped ones");
    let parked =
        counted(&fleet, workers, "fleet_tenant_turns_parked_total", &["tenant=\"other\"", "reason=\"concurrency\""])
            .await;
    assert!(parked >= 1.0, "steps over the cap were parked ({parked})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_light_tenants_new_turn_skips_a_flooding_tenants_backlog() {
    let llm = MockLlm::start(|_, _| LlmReply::text("fine").after(Duration::from_millis(100))).await;
    // One worker slot, no provider budget: the worker is what is scarce. A tenant's first two new
    // turns take the light lane, then one every ten seconds.
    let options = llm_fleet(&llm)
        .env("FLEET_WORKER_CONCURRENCY", "1")
        .env("FLEET_LIGHT_LANE_BURST", "2")
        .env("FLEET_LIGHT_LANE_RATE", "0.1");
    let fleet = spawn_fleet(options).await;
    let mut flood = Vec::new();
    for i in 0..15 {
        flood.push(post_turn(&fleet, &tenant_turn(&format!("s_lane_a{i}"), "flood", "acme", "normal")).await);
    }
    fleet_tests::wait_for("the flood's first call", Duration::from_secs(20), || async {
        (!starts_of(&llm, "flood").is_empty()).then_some(())
    })
    .await;
    let light = post_turn(&fleet, &tenant_turn("s_lane_b", "light", "globex", "normal")).await;
    for id in flood.iter().chain([&light]) {
        fleet.wait_status(id, "succeeded", Duration::from_secs(60)).await;
    }
    let light_at = starts_of(&llm, "light")[0];
    let flood_after = starts_of(&llm, "flood").iter().filter(|s| **s > light_at).count();
    println!("flood calls after the light tenant's: {flood_after} of 15");
    assert!(flood_after >= 8, "the light tenant's turn waited behind the flood ({flood_after} of 15 after it)");
}
