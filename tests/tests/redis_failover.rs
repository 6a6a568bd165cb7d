//! A Redis Cluster with a replica per master (six `redis-server`s of the test's own) under steady
//! load: one master is SIGKILLed and its replica promoted. Replication is asynchronous, so a write
//! the master acknowledged may be missing on the replica; the run reports what that cost (jobs
//! lost, callbacks that reached the receiver twice) and how long the fleet took to accept and
//! work jobs again. `make test` runs it alone, after the rest.
//!
//! Settings: FLEET_FAILOVER_JOBS (2000), FLEET_FAILOVER_RATE (100 enqueues/s),
//! FLEET_FAILOVER_NODE_TIMEOUT_MS (2000: `cluster-node-timeout`, how long a master may be silent
//! before its replica takes over), FLEET_FAILOVER_CLAIM_LEASE (30 s: the workers' FLEET_CLAIM_LEASE).

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use fleet_tests::load::{report, Load};
use fleet_tests::redis_failover::ReplicatedRedisCluster;
use fleet_tests::{spawn_fleet, wait_for, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_redis_failover_secret";

fn setting<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_master_killed_under_load_fails_over_to_its_replica() {
    let node_timeout = Duration::from_millis(setting("FLEET_FAILOVER_NODE_TIMEOUT_MS", 2000));
    // A job whose delivery comes back while its claim's lease holds waits the lease out.
    let lease = Duration::from_secs(setting("FLEET_FAILOVER_CLAIM_LEASE", 30));
    let mut redis = ReplicatedRedisCluster::start(node_timeout).await;
    let receiver = Receiver::start(SECRET, |r, _| {
        Reply::result(json!({"n": r.json["parameters"]["n"].clone()})).after(Duration::from_millis(20))
    })
    .await;
    let fleet = Arc::new(
        spawn_fleet(
            FleetOptions::default()
                .workers(2)
                .env("FLEET_REDIS_URL", &redis.url())
                .env("FLEET_CLAIM_LEASE", &lease.as_secs().to_string())
                .env("RUST_LOG", "warn"),
        )
        .await,
    );
    fleet.register_tool("replicated", &receiver.url("/r"), SECRET).await;
    redis.wait_replicas_in_sync(Duration::from_secs(30)).await;
    let nodes = redis.nodes(redis.ports[0]).await.expect("CLUSTER NODES");
    let victim = nodes.iter().find(|n| n.master).expect("a master").clone();
    let replica = nodes.iter().find(|n| n.master_id.as_deref() == Some(&victim.id)).expect("its replica").clone();

    let load = Load::start(fleet.clone(), "replicated", setting("FLEET_FAILOVER_RATE", 100.0));
    let warm = load.accepted() + 300;
    wait_for("the load to run", Duration::from_secs(120), || async { (load.accepted() >= warm).then_some(()) }).await;
    let killed = Instant::now();
    let events = vec![(format!("master :{} SIGKILLed", victim.port), killed)];
    redis.kill(victim.port);
    let promoted = wait_for("the replica to be promoted", Duration::from_secs(60), || async {
        let nodes = redis.nodes(replica.port).await?;
        nodes.iter().any(|n| n.port == replica.port && n.master).then_some(killed.elapsed())
    })
    .await;
    redis.wait_healthy(Duration::from_secs(60)).await;
    let healthy = killed.elapsed();
    let more = load.accepted() + 300;
    wait_for("jobs accepted after the failover", Duration::from_secs(180), || async {
        (load.accepted() >= more).then_some(())
    })
    .await;

    let title = "redis failover";
    let report = report(title, &fleet, &receiver, load, events, setting("FLEET_FAILOVER_JOBS", 2000)).await;
    println!(
        "  replica :{} promoted {:.1} s after the kill (cluster-node-timeout {} ms, claim lease {} s), cluster ok after {:.1} s",
        replica.port,
        promoted.as_secs_f64(),
        node_timeout.as_millis(),
        lease.as_secs(),
        healthy.as_secs_f64()
    );
    for (id, n) in &report.tally.doubled {
        println!("  doubled: {id} reached the receiver {n} times");
    }
    assert!(report.tally.lost.is_empty(), "accepted and lost: {:?}", report.tally.lost);
    // A worker whose callback ran retries storing its result for a third of the lease: a failover
    // that is over by then calls no tool owner twice. (A longer one would: its jobs come back.)
    if promoted + Duration::from_secs(2) < lease / 3 {
        assert!(report.tally.doubled.is_empty(), "called twice: {:?}", report.tally.doubled);
    }
    assert!(report.unrecovered().is_empty(), "not recovered: {:?}", report.unrecovered());
}
