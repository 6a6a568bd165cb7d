//! A claim lost in a Redis failover (asynchronous replication: the promoted replica never saw the
//! master's newest writes) against the real Redis: the worker holding it still stores its result,
//! and every later copy of the job finds it done; a claim that is there still fences off any other
//! token.

use std::time::Duration;

use fleet_platform::metrics::Metrics;
use fleet_platform::store::{Claim, Store};
use fleet_protocol::keys::Keys;

#[tokio::test]
async fn a_lost_claim_still_keeps_its_result_and_a_taken_one_still_fences() {
    let url = std::env::var("FLEET_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let prefix = format!("lostclaim{}:", std::process::id());
    let keys = Keys::new(prefix);
    let store =
        Store::open(&url, keys.clone(), Duration::from_secs(2), Metrics::new("worker"), &Default::default()).unwrap();
    let client = redis::Client::open(url).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let lease = Duration::from_secs(60);
    let (lost, taken) = ("exec_lost_claim", "exec_taken_claim");

    // The failover drops the claim while its worker calls the tool owner.
    let Claim::Acquired { token } = store.claim(lost, "worker-a", lease).await.unwrap() else { panic!("claim") };
    let _: () = redis::cmd("DEL").arg(keys.idempotency(lost)).query_async(&mut con).await.unwrap();
    let result = serde_json::json!({"ok": 1});
    assert!(store.complete(lost, token, &result).await.unwrap(), "the result is kept");
    match store.claim(lost, "worker-b", lease).await.unwrap() {
        Claim::AlreadyDone { result: stored } => assert_eq!(stored, result),
        other => panic!("a copy must find the job done, not {other:?}"),
    }

    // A claim that is there and held by another token still fences the writer off.
    let Claim::Acquired { token } = store.claim(taken, "worker-a", lease).await.unwrap() else { panic!("claim") };
    assert!(!store.complete(taken, token + 1, &serde_json::json!({"by": "stale"})).await.unwrap());
    assert!(store.complete(taken, token, &serde_json::json!({"by": "holder"})).await.unwrap());

    let _: () =
        redis::cmd("DEL").arg(keys.idempotency(lost)).arg(keys.idempotency(taken)).query_async(&mut con).await.unwrap();
}

/// Redis can run a script and die before its reply is sent (a restart, a failover): the worker
/// retries `complete`, and the retry finds the claim already `done` by this very token. That is
/// the worker's own result, not a newer claim's: answering "fenced" made the worker ack the job and
/// drop it, and its record stayed `running` for good.
#[tokio::test]
async fn a_retried_complete_whose_first_reply_was_lost_is_not_fenced() {
    let url = std::env::var("FLEET_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let keys = Keys::new(format!("retriedcomplete{}:", std::process::id()));
    let store =
        Store::open(&url, keys.clone(), Duration::from_secs(2), Metrics::new("worker"), &Default::default()).unwrap();
    let id = "exec_retried_complete";
    let Claim::Acquired { token } = store.claim(id, "worker-a", Duration::from_secs(60)).await.unwrap() else {
        panic!("claim")
    };
    let result = serde_json::json!({"ok": 1});
    assert!(store.complete(id, token, &result).await.unwrap(), "the first complete stores the result");
    assert!(store.complete(id, token, &result).await.unwrap(), "its retry by the same claim is not fenced");
    assert!(!store.complete(id, token + 1, &result).await.unwrap(), "another token is still fenced off");
    match store.claim(id, "worker-b", Duration::from_secs(60)).await.unwrap() {
        Claim::AlreadyDone { result: stored } => assert_eq!(stored, result),
        other => panic!("a copy must find the job done, not {other:?}"),
    }
    let client = redis::Client::open(url).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("DEL").arg(keys.idempotency(id)).query_async(&mut con).await.unwrap();
}
