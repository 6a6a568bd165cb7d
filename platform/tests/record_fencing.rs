//! The execution record's fence against the real Redis: a write carrying an older claim token is
//! refused once a newer one wrote, so a stale worker never overwrites a newer status.

use std::time::Duration;

use fleet_platform::metrics::Metrics;
use fleet_platform::store::Store;
use fleet_protocol::execution::{AttemptOutcome, AttemptRecord, ExecutionStatus};
use fleet_protocol::keys::Keys;

fn attempt(n: u32, outcome: AttemptOutcome) -> AttemptRecord {
    AttemptRecord {
        attempt: n,
        started_at: "2026-01-01T00:00:00Z".into(),
        duration_ms: 1,
        http_status: Some(503),
        error: Some("HTTP 503".into()),
        outcome,
        prompt_tokens: None,
        completion_tokens: None,
    }
}

#[tokio::test]
async fn an_older_token_cannot_write_after_a_newer_one() {
    let url = std::env::var("FLEET_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let prefix = format!("fence{}:", std::process::id());
    let store = Store::open(
        &url,
        Keys::new(prefix.clone()),
        Duration::from_secs(2),
        Metrics::new("worker"),
        &Default::default(),
    )
    .unwrap();
    let id = "exec_fence_test";
    let (stale, newer) = (1, 2);

    assert!(store.set_status(id, ExecutionStatus::Running, Some(1), 1, Some(stale)).await.unwrap());
    assert!(store.set_status(id, ExecutionStatus::Running, Some(1), 2, Some(newer)).await.unwrap());
    let late = attempt(1, AttemptOutcome::Retry);
    assert!(!store.record_attempt(id, &late, ExecutionStatus::Retrying, None, 3, Some(stale)).await.unwrap());
    let view = store.get_execution(id).await.unwrap().unwrap();
    assert_eq!((view.status, view.attempts.len()), (ExecutionStatus::Running, 0), "nothing of the stale write");

    let done = AttemptRecord { http_status: Some(200), error: None, ..attempt(1, AttemptOutcome::Success) };
    let result = serde_json::json!({"ok": true});
    assert!(store.record_attempt(id, &done, ExecutionStatus::Succeeded, Some(&result), 4, Some(newer)).await.unwrap());
    assert!(!store.set_status(id, ExecutionStatus::Retrying, None, 5, Some(stale)).await.unwrap());
    // The same token may write again (the dead-letter status after its own release).
    assert!(store.set_status(id, ExecutionStatus::Succeeded, None, 6, Some(newer)).await.unwrap());
    let view = store.get_execution(id).await.unwrap().unwrap();
    assert_eq!(view.status, ExecutionStatus::Succeeded);
    assert_eq!(view.result, Some(result));
    assert_eq!(view.attempts, vec![done]);

    // Unfenced writes (the dispatcher's replay) still apply.
    assert!(store.set_status(id, ExecutionStatus::Queued, None, 7, None).await.unwrap());
    assert_eq!(store.get_execution(id).await.unwrap().unwrap().status, ExecutionStatus::Queued);

    let client = redis::Client::open(url).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg(Keys::new(prefix.clone()).execution(id))
        .arg(Keys::new(prefix).attempts(id))
        .query_async(&mut con)
        .await
        .unwrap();
}
