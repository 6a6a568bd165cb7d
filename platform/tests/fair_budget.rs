//! The provider budget's fair line against the real Redis and the local Redis Cluster: a tenant
//! arriving behind another's backlog runs at once from the burst the heavy tenant leaves, a
//! tenant's high-priority step takes its tenant's first place, a tenant's turn slots go to its
//! turns in the order they asked, and a place whose step stopped asking is given up.

use std::time::Duration;

use fleet_platform::metrics::Metrics;
use fleet_platform::store::{Pace, Spend, Store, Waiter};
use fleet_protocol::budget::{Bucket, Budget};
use fleet_protocol::fair::Priority;
use fleet_protocol::keys::Keys;

fn store(url: &str) -> Store {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let prefix = format!("fair{}-{}:", std::process::id(), nanos % 1_000_000_007);
    Store::open(url, Keys::new(prefix), Duration::from_secs(2), Metrics::new("worker"), &Default::default()).unwrap()
}

fn single() -> String {
    std::env::var("FLEET_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

fn cluster() -> String {
    std::env::var("FLEET_TEST_REDIS_CLUSTER_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002".into())
}

/// Six requests a minute (one per 10 s), 100 seconds of burst (ten calls). The slow refill keeps
/// the test off the clock: at one call per 100 ms, a loop of 20 asks stalled behind a slow shared
/// Redis outlasted two refills, and the heavy tenant ran 8.
fn buckets() -> Vec<Bucket> {
    Budget { requests_per_minute: Some(6), burst_seconds: Some(100), ..Default::default() }.buckets("m")
}

async fn ask(store: &Store, provider: &str, id: &str, tenant: &str, priority: Priority) -> Spend {
    let waiter = Waiter { id, tenant, weight: 1, priority };
    store.limits().budget_reserve(provider, &buckets(), waiter, 10, Duration::ZERO, false).await.unwrap()
}

async fn line(store: &Store) {
    // A alone: runs while it has used less than half the burst, then waits (heavy).
    let mut a_ran = 0;
    for n in 0..20 {
        if matches!(ask(store, "p", &format!("a{n}"), "a", Priority::Normal).await, Spend::Now { .. }) {
            a_ran += 1;
        }
    }
    assert!((5..=6).contains(&a_ran), "a heavy tenant fills half the burst: {a_ran}");
    // B arrives behind A's 14-15 waiting steps: its four run at once from the reserve (the half
    // of the burst A leaves, less what A's last call took), though A's places stand between its
    // own in the line: A, a heavy user, could not use that room anyway.
    for n in 0..4 {
        let spend = ask(store, "p", &format!("b{n}"), "b", Priority::Normal).await;
        assert!(matches!(spend, Spend::Now { .. }), "b{n} waited behind a's backlog: {spend:?}");
    }
    // A's first waiter is still first in line for the next free slot.
    match ask(store, "p", "a19", "a", Priority::Normal).await {
        Spend::Wait(w) => assert!(w > Duration::from_millis(500), "a19 stands behind a's other waiters: {w:?}"),
        other => panic!("a19 ran before a's earlier waiters: {other:?}"),
    }
}

async fn priority(store: &Store) {
    for n in 0..10 {
        ask(store, "q", &format!("n{n}"), "c", Priority::Normal).await;
    }
    let high = ask(store, "q", "h", "c", Priority::High).await;
    let normal = ask(store, "q", "n9", "c", Priority::Normal).await;
    match (high, normal) {
        (Spend::Wait(h), Spend::Wait(n)) => assert!(h < n, "high {h:?} after normal {n:?}"),
        other => panic!("both wait for the tenant's next places: {other:?}"),
    }
    // Another tenant's place is not taken by c's priority: d arrives and runs from the reserve.
    assert!(matches!(ask(store, "q", "d0", "d", Priority::Low).await, Spend::Now { .. }));
}

async fn turn_slots(store: &Store) {
    let lease = Duration::from_secs(30);
    let recheck = Duration::from_millis(250);
    let take = |holder: &'static str, turn: &'static str| {
        store.limits().acquire_turn_slot("t", holder, turn, 2, lease, recheck)
    };
    assert_eq!(take("t1:1", "t1").await.unwrap(), Pace::Now);
    assert_eq!(take("t2:1", "t2").await.unwrap(), Pace::Now);
    let third = take("t3:1", "t3").await.unwrap();
    assert_eq!(third, Pace::Wait(recheck), "first in line");
    assert!(matches!(take("t4:1", "t4").await.unwrap(), Pace::Wait(_)));
    store.limits().release_slot(fleet_platform::store::Semaphore::TenantTurns("t"), "t1:1").await.unwrap();
    // One slot free: t4 asks first but t3 stands before it.
    assert!(matches!(take("t4:1", "t4").await.unwrap(), Pace::Wait(_)), "t4 jumped the line");
    assert_eq!(take("t3:2", "t3").await.unwrap(), Pace::Now, "t3's next claim takes its place");
    assert!(matches!(take("t4:1", "t4").await.unwrap(), Pace::Wait(_)), "both slots held");
}

#[tokio::test]
async fn the_fair_line_on_one_redis() {
    let store = store(&single());
    line(&store).await;
    priority(&store).await;
    turn_slots(&store).await;
}

#[tokio::test]
async fn the_fair_line_on_a_redis_cluster() {
    let store = store(&cluster());
    line(&store).await;
    priority(&store).await;
    turn_slots(&store).await;
}
