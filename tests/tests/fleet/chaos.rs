//! Chaos soak: thousands of jobs through 3 workers while a random worker is SIGKILLed and restarted
//! every 0.75 s. Every job must end succeeded or dead-lettered (none lost), and each execution's
//! side effect must happen once. FLEET_SOAK_JOBS sets the size (CI: 2000; `make soak`: 10000).

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

use fleet_tests::{spawn_fleet, wait_for, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_chaos_soak_secret_1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_soak_loses_nothing_and_doubles_no_side_effect() {
    let jobs: usize = std::env::var("FLEET_SOAK_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let receiver = Receiver::start(SECRET, |r, _| {
        Reply::result(json!({"n": r.json["parameters"]["n"].clone()})).after(Duration::from_millis(50))
    })
    .await;
    let mut fleet = spawn_fleet(
        FleetOptions::default()
            .workers(0)
            .env("FLEET_WORKER_CONCURRENCY", "16")
            .env("FLEET_CLAIM_LEASE", "2")
            .env("FLEET_RETRY_DELAYS", "0.2,0.4,0.8,1.6,3.2"),
    )
    .await;
    fleet.register_tool("soak", &receiver.url("/soak"), SECRET).await;
    let started = Instant::now();
    let ids: Vec<String> = {
        let fleet = &fleet;
        futures::stream::iter(0..jobs)
            .map(|n| async move { fleet.call_tool("soak", json!({"query": "soak", "n": n})).await })
            .buffer_unordered(16)
            .collect()
            .await
    };
    // Workers start once the jobs wait, so the kills land while they work.
    let mut alive = Vec::new();
    for _ in 0..3 {
        alive.push(fleet.spawn_worker().await);
    }
    let mut kills = 0;
    let finals = |fleet: &fleet_tests::Fleet, ids: Vec<String>| {
        let http = fleet.http.clone();
        let (api, token) = (fleet.api.clone(), fleet.token.clone());
        async move {
            let statuses: Vec<(String, usize)> = futures::stream::iter(ids)
                .map(|id| {
                    let (http, api, token) = (http.clone(), api.clone(), token.clone());
                    async move {
                        let v: Value = http
                            .get(format!("{api}/v1/executions/{id}"))
                            .bearer_auth(token)
                            .send()
                            .await
                            .unwrap()
                            .json()
                            .await
                            .unwrap();
                        let successes = v["data"]["attempts"]
                            .as_array()
                            .map(|a| a.iter().filter(|a| a["outcome"] == "success").count())
                            .unwrap_or(0);
                        (v["data"]["status"].as_str().unwrap_or("missing").to_string(), successes)
                    }
                })
                .buffer_unordered(32)
                .collect()
                .await;
            statuses
        }
    };
    // Kill and restart a random worker every 0.75 s until every job has had its side effect.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if receiver.total_side_effects() as usize >= jobs {
            break;
        }
        assert!(Instant::now() < deadline, "the soak did not finish");
        tokio::time::sleep(Duration::from_millis(750)).await;
        if receiver.total_side_effects() as usize >= jobs {
            break;
        }
        let pick = (uuid::Uuid::new_v4().as_u128() % alive.len() as u128) as usize;
        let victim = alive.remove(pick);
        fleet.kill_worker(victim);
        kills += 1;
        alive.push(fleet.spawn_worker().await);
    }
    let statuses = wait_for("every job to be final", Duration::from_secs(120), || {
        let check = finals(&fleet, ids.clone());
        async move {
            let s = check.await;
            s.iter().all(|(s, _)| s == "succeeded" || s == "dead_lettered").then_some(s)
        }
    })
    .await;
    let succeeded = statuses.iter().filter(|(s, _)| s == "succeeded").count();
    let dead = statuses.iter().filter(|(s, _)| s == "dead_lettered").count();
    // The fleet's own guarantee: a result is stored once per execution, whatever was redelivered.
    let stored_twice = statuses.iter().filter(|(_, successes)| *successes > 1).count();
    let requests = receiver.received().len();
    let doubled: usize = ids.iter().filter(|id| receiver.side_effects(id) > 1).count();
    println!(
        "chaos soak: {jobs} jobs, 3 workers × 16, receiver 50 ms, {kills} SIGKILLs in {:.1} s: {succeeded} succeeded, {dead} dead-lettered, 0 lost, \
         {requests} callback requests ({} redelivered, absorbed by idempotency), results stored twice: {stored_twice}, side effects doubled at the (idempotent) receiver: {doubled}",
        started.elapsed().as_secs_f64(),
        requests - jobs.min(requests)
    );
    assert_eq!(succeeded + dead, jobs, "no job lost");
    assert_eq!(doubled, 0);
    assert_eq!(stored_twice, 0, "a result was stored more than once");
    assert!(kills >= 2, "the soak must kill workers while they work ({kills} kills)");
    for id in &ids {
        assert_eq!(receiver.side_effects(id), 1, "{id}");
    }
    assert!(requests - jobs <= 16 * (kills + 1) * 2, "redeliveries bounded by prefetch × kills: {requests}");
}
