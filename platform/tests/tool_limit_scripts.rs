//! The tool-limit scripts against the real Redis and the local Redis Cluster: the semaphore
//! admits `limit` holders, lets a holder in again, frees a slot on release or when a lease runs
//! out; the rate limiter follows `gcra_reserve` (a backlog is given slots one interval apart, and a
//! call holding a slot runs when it comes back for it).

use std::time::Duration;

use fleet_platform::metrics::Metrics;
use fleet_platform::store::{Pace, Semaphore, SlotGrant, Store};
use fleet_protocol::keys::Keys;
use fleet_protocol::limits::RateLimit;

fn store(url: &str) -> Store {
    let prefix = format!("limits{}-{}:", std::process::id(), rand_suffix());
    Store::open(url, Keys::new(prefix), Duration::from_secs(2), Metrics::new("worker"), &Default::default()).unwrap()
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 % 1_000_000_007
}

fn single() -> String {
    std::env::var("FLEET_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

fn cluster() -> String {
    std::env::var("FLEET_TEST_REDIS_CLUSTER_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002".into())
}

async fn semaphore(store: &Store) {
    let lease = Duration::from_secs(30);
    assert_eq!(store.limits().acquire_slot(Semaphore::Tool("t"), "a:1", 2, lease).await.unwrap(), SlotGrant::Acquired);
    assert_eq!(store.limits().acquire_slot(Semaphore::Tool("t"), "b:1", 2, lease).await.unwrap(), SlotGrant::Acquired);
    assert_eq!(
        store.limits().acquire_slot(Semaphore::Tool("t"), "a:1", 2, lease).await.unwrap(),
        SlotGrant::Acquired,
        "a holder keeps its slot"
    );
    match store.limits().acquire_slot(Semaphore::Tool("t"), "c:1", 2, lease).await.unwrap() {
        SlotGrant::Full { earliest_expiry } => assert!(earliest_expiry <= lease, "{earliest_expiry:?}"),
        other => panic!("a third holder of 2 slots: {other:?}"),
    }
    assert_eq!(
        store.limits().acquire_slot(Semaphore::Tool("other"), "c:1", 2, lease).await.unwrap(),
        SlotGrant::Acquired,
        "per tool"
    );
    assert!(store.limits().renew_slot(Semaphore::Tool("t"), "a:1", lease).await.unwrap());
    store.limits().release_slot(Semaphore::Tool("t"), "a:1").await.unwrap();
    assert!(
        !store.limits().renew_slot(Semaphore::Tool("t"), "a:1", lease).await.unwrap(),
        "released: nothing to renew"
    );
    assert_eq!(store.limits().acquire_slot(Semaphore::Tool("t"), "c:1", 2, lease).await.unwrap(), SlotGrant::Acquired);

    // A holder that dies leaves a lease that runs out.
    let short = Duration::from_millis(200);
    assert_eq!(
        store.limits().acquire_slot(Semaphore::Tool("u"), "dead:1", 1, short).await.unwrap(),
        SlotGrant::Acquired
    );
    assert!(matches!(
        store.limits().acquire_slot(Semaphore::Tool("u"), "live:1", 1, short).await.unwrap(),
        SlotGrant::Full { .. }
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        store.limits().acquire_slot(Semaphore::Tool("u"), "live:1", 1, short).await.unwrap(),
        SlotGrant::Acquired
    );
}

/// Millisecond truncation on both clocks (Redis's and this one): far below the 200 ms between
/// slots, so a call given the next slot instead of its own still fails.
const SLACK_MS: i64 = 20;

async fn rate(store: &Store) {
    let limit = RateLimit { per_second: 5.0, burst: 2 };
    let early = Duration::from_millis(50);
    let clock = std::time::Instant::now();
    assert_eq!(store.limits().pace_tool("r", "exec_0", &limit, early).await.unwrap(), Pace::Now);
    // The first call's slot (Redis's clock) lies between `clock` and now.
    let first_answered = clock.elapsed().as_millis() as i64;
    assert_eq!(store.limits().pace_tool("r", "exec_1", &limit, early).await.unwrap(), Pace::Now, "a burst of 2");
    let mut slots = vec![];
    for n in 2..6 {
        let sent = clock.elapsed().as_millis() as i64;
        let wait = match store.limits().pace_tool("r", &format!("exec_{n}"), &limit, early).await.unwrap() {
            Pace::Wait(w) => w.as_millis() as i64,
            Pace::Now => panic!("exec_{n} is over the limit"),
        };
        let answered = clock.elapsed().as_millis() as i64;
        // Its slot, 200 ms apart from the first call's after the burst, as seen from here (bounds
        // that hold however long the calls took).
        let slot = 200 * (n as i64 - 1);
        assert!(sent + wait <= slot + first_answered + SLACK_MS, "exec_{n}: wait {wait} ms sent at {sent} ms");
        assert!(answered + wait >= slot - SLACK_MS, "exec_{n}: wait {wait} ms answered at {answered} ms");
        slots.push(answered + wait);
    }
    // Asking again before its slot: the same slot, not a new one at the back.
    match store.limits().pace_tool("r", "exec_5", &limit, early).await.unwrap() {
        Pace::Wait(w) => {
            assert!(clock.elapsed().as_millis() as i64 + w.as_millis() as i64 <= slots[3] + SLACK_MS, "{w:?}")
        }
        Pace::Now => panic!("exec_5 came back early"),
    }
    tokio::time::sleep_until((clock + Duration::from_millis(slots[0] as u64)).into()).await;
    assert_eq!(store.limits().pace_tool("r", "exec_2", &limit, early).await.unwrap(), Pace::Now, "its slot has come");
    match store.limits().pace_tool("r", "exec_late", &limit, early).await.unwrap() {
        Pace::Wait(w) => {
            let at = clock.elapsed().as_millis() as i64 + w.as_millis() as i64;
            assert!(at >= 999, "behind the reserved slots (1000 ms after the first call): {at} ms");
        }
        Pace::Now => panic!("a newcomer jumped the reservations"),
    }
}

#[tokio::test]
async fn the_semaphore_and_the_rate_limiter_on_one_redis() {
    let store = store(&single());
    semaphore(&store).await;
    rate(&store).await;
}

#[tokio::test]
async fn the_semaphore_and_the_rate_limiter_on_a_redis_cluster() {
    let store = store(&cluster());
    semaphore(&store).await;
    rate(&store).await;
}
