//! An execution's life scripts against the real Redis: what a delivery is (the record's step, a
//! copy of an earlier one, owed work, a finished or cancelled execution), transitions fenced by
//! the claim's token, a claim lost in a failover, a replay's new generation, and a parked step's
//! marker.

use std::time::Duration;

use serde_json::json;

use fleet_platform::metrics::Metrics;
use fleet_platform::store::{AdmitMode, ClaimAfter, Delivery, Fence, NewExecution, Store, Transition};
use fleet_protocol::envelope::{DeadLetterReason, Verdict};
use fleet_protocol::execution::{AttemptOutcome, AttemptRecord, ExecutionStatus};
use fleet_protocol::keys::Keys;
use fleet_protocol::life::{Claimed, Owed, Step};

const LEASE: Duration = Duration::from_secs(60);

struct Fixture {
    store: Store,
    keys: Keys,
    con: redis::aio::MultiplexedConnection,
}

impl Fixture {
    async fn new(name: &str) -> Self {
        let url = std::env::var("FLEET_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
        let keys = Keys::new(format!("{name}{}:", std::process::id()));
        let store =
            Store::open(&url, keys.clone(), Duration::from_secs(2), Metrics::new("worker"), &Default::default())
                .unwrap();
        let con = redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
        Fixture { store, keys, con }
    }

    async fn record(&self, id: &str) {
        let new = NewExecution {
            execution_id: id,
            kind: fleet_protocol::envelope::JobKind::ToolCall,
            tool_name: Some("t"),
            room_id: None,
            assistant_id: None,
            tenant: None,
            now_ms: 1,
            run_at_ms: None,
        };
        self.store.executions().create_execution(&new, None).await.unwrap();
    }

    async fn admit(&self, id: &str, step: Step) -> Claimed {
        self.store.executions().admit(id, "w", LEASE, step, AdmitMode::Run).await.unwrap().claimed
    }

    async fn admit_parked(&self, id: &str, step: Step, park: Option<u64>) -> Claimed {
        self.store
            .executions()
            .admit_delivery(id, "w", LEASE, Delivery { step, park, with_turn: false }, AdmitMode::Hold)
            .await
            .unwrap()
            .claimed
    }

    async fn token(&self, id: &str, step: Step) -> u64 {
        match self.admit(id, step).await {
            Claimed::Held { token } => token,
            other => panic!("expected the claim, got {other:?}"),
        }
    }

    async fn write(&self, id: &str, token: u64, t: &Transition<'_>) -> bool {
        self.store.executions().transition(id, Fence::Token(token), LEASE, t).await.unwrap()
    }

    async fn cleanup(mut self) {
        let keys: Vec<String> =
            redis::cmd("KEYS").arg(format!("{}*", self.keys.prefix())).query_async(&mut self.con).await.unwrap();
        for key in keys {
            let _: () = redis::cmd("DEL").arg(key).query_async(&mut self.con).await.unwrap();
        }
    }
}

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
        timed_out: false,
    }
}

#[tokio::test]
async fn a_delivery_runs_only_at_the_step_the_record_expects() {
    let f = Fixture::new("admit").await;
    let id = "exec_admit";
    f.record(id).await;
    let first = Step::FIRST;
    let token = f.token(id, first).await;
    assert!(matches!(f.admit(id, first).await, Claimed::Busy { .. }), "a live claim");

    // Attempt 1 failed: attempt 2 is owed, then published and retired.
    let failed = attempt(1, AttemptOutcome::Retry);
    let next = first.next_attempt();
    let owed = Owed::TurnNext; // any owed value stands for "the next delivery's publish"
    let retrying = Transition::new(ClaimAfter::Release("released"))
        .status(ExecutionStatus::Retrying)
        .step(next)
        .owe(&owed)
        .attempt(&failed);
    assert!(f.write(id, token, &retrying).await);
    assert_eq!(f.admit(id, first).await, Claimed::Owed { owed: owed.clone(), result: None }, "a copy carries it out");
    assert!(f.store.executions().settle_owed(id, &owed, &[]).await.unwrap());
    assert_eq!(f.admit(id, first).await, Claimed::Copy, "then a copy of attempt 1 is only a copy");
    assert!(!f.write(id, token, &retrying).await, "the released claim fences its old holder off");

    // Attempt 2 runs with a newer token; a poll of it comes later; polls before that are copies.
    let token2 = f.token(id, next).await;
    assert!(token2 > token);
    let polled = Transition::new(ClaimAfter::Release("polling")).step(next.next_poll());
    assert!(f.write(id, token2, &polled).await);
    assert_eq!(f.admit(id, next).await, Claimed::Copy, "the POST again while polled");
    let token3 = f.token(id, next.next_poll()).await;
    let result = json!({"ok": true});
    let done = Transition::new(ClaimAfter::Complete(&result)).status(ExecutionStatus::Succeeded);
    assert!(f.write(id, token3, &done).await);
    assert!(f.write(id, token3, &done).await, "a retried complete by the same claim is not fenced");
    assert!(!f.write(id, token2, &done).await, "another token is");
    for step in [first, next, next.next_poll(), next.next_attempt()] {
        assert_eq!(f.admit(id, step).await, Claimed::Done { result: result.clone() }, "{step:?}");
    }
    let view = f.store.executions().get_execution(id).await.unwrap().unwrap();
    assert_eq!((view.record.status, view.attempts.len()), (ExecutionStatus::Succeeded, 1));
    f.cleanup().await;
}

#[tokio::test]
async fn a_dead_letter_is_revived_only_by_a_replay() {
    let f = Fixture::new("replay").await;
    let id = "exec_replay";
    f.record(id).await;
    let token = f.token(id, Step::FIRST).await;
    let owed = Owed::Settle { verdict: Verdict { reason: DeadLetterReason::Permanent, error: "HTTP 400".into() } };
    let decided = Transition::new(ClaimAfter::Keep).step(Step::FIRST.next_attempt()).owe(&owed);
    assert!(f.write(id, token, &decided).await);
    assert!(matches!(f.admit(id, Step::FIRST).await, Claimed::Busy { .. }), "the settling claim is live");
    let ended =
        Transition::new(ClaimAfter::Release("dead_lettered")).status(ExecutionStatus::DeadLettered).owe_nothing();
    assert!(f.store.executions().transition(id, Fence::Owed(&owed), LEASE, &ended).await.unwrap());
    assert!(
        !f.store.executions().transition(id, Fence::Owed(&owed), LEASE, &ended).await.unwrap(),
        "owed work retires once"
    );
    assert_eq!(f.admit(id, Step::FIRST).await, Claimed::Copy);
    assert_eq!(f.store.executions().replay_execution(id, 0).await.unwrap(), Some(1));
    assert_eq!(f.store.executions().replay_execution(id, 0).await.unwrap(), None, "not dead-lettered any more");
    assert_eq!(f.admit(id, Step::FIRST).await, Claimed::Copy, "a job from before the replay");
    let replayed = Step::FIRST.replayed(0);
    assert!(matches!(f.admit(id, replayed).await, Claimed::Held { .. }), "the replay's own job runs");
    f.cleanup().await;
}

#[tokio::test]
async fn a_lost_claim_neither_stalls_nor_loses_the_execution() {
    let f = Fixture::new("lostclaim").await;
    let mut con = f.con.clone();
    let (id, other) = ("exec_lost", "exec_lost_next");
    f.record(id).await;
    f.record(other).await;

    // The failover drops the claim while its worker calls the tool owner: the result is kept.
    let token = f.token(id, Step::FIRST).await;
    let _: () = redis::cmd("DEL").arg(f.keys.idempotency(id)).query_async(&mut con).await.unwrap();
    let result = json!({"ok": 1});
    let done = Transition::new(ClaimAfter::Complete(&result)).status(ExecutionStatus::Succeeded);
    assert!(f.write(id, token, &done).await, "the result is kept");
    assert_eq!(f.admit(id, Step::FIRST).await, Claimed::Done { result });

    // The claim key is lost between attempts: the next attempt's claim gets a token past the
    // record's fence, so the record does not fence it off.
    let token = f.token(other, Step::FIRST).await;
    let retrying = Transition::new(ClaimAfter::Release("released")).step(Step::FIRST.next_attempt());
    assert!(f.write(other, token, &retrying).await);
    let _: () = redis::cmd("DEL").arg(f.keys.idempotency(other)).query_async(&mut con).await.unwrap();
    let again = f.token(other, Step::FIRST.next_attempt()).await;
    assert!(again > token, "token {again} after {token}");
    assert!(f.write(other, again, &Transition::new(ClaimAfter::Keep)).await);
    f.cleanup().await;
}

#[tokio::test]
async fn while_a_step_is_parked_only_its_parked_delivery_is_admitted() {
    let f = Fixture::new("parked").await;
    let id = "exec_parked";
    f.record(id).await;
    let step = Step::FIRST;
    let now = fleet_platform::now_ms();

    let token = f.token(id, step).await;
    assert!(
        !f.store.executions().mark_parked(id, token, step, now + 60_000).await.unwrap(),
        "not while the claim is held"
    );
    assert!(f.write(id, token, &Transition::new(ClaimAfter::Release("released"))).await);
    assert!(
        !f.store.executions().mark_parked(id, token + 1, step, now + 60_000).await.unwrap(),
        "not by another claim"
    );
    assert!(
        !f.store.executions().mark_parked(id, token, step.next_attempt(), now + 60_000).await.unwrap(),
        "not another step"
    );
    assert!(
        f.store.executions().mark_parked(id, token, step, now + 60_000).await.unwrap(),
        "the park of the claim given back"
    );

    assert_eq!(f.admit_parked(id, step, None).await, Claimed::Copy, "a copy of the step while it is parked");
    assert_eq!(f.admit_parked(id, step, Some(token - 1)).await, Claimed::Copy, "a delivery of an older park");
    let again = match f.admit_parked(id, step, Some(token)).await {
        Claimed::Held { token } => token,
        other => panic!("the parked delivery is admitted, even early: {other:?}"),
    };
    assert!(f.write(id, again, &Transition::new(ClaimAfter::Release("released"))).await);
    assert!(!f.store.executions().mark_parked(id, token, step, now + 60_000).await.unwrap(), "a claim was made since");
    let token = match f.admit_parked(id, step, None).await {
        Claimed::Held { token } => token,
        other => panic!("the claim cleared the marker: {other:?}"),
    };

    // A marker past its due time and the slack is ignored: a lost parked delivery is a stall.
    assert!(f.write(id, token, &Transition::new(ClaimAfter::Release("released"))).await);
    let slack = (fleet_platform::store::PARK_SLACK + LEASE).as_millis() as i64;
    assert!(f.store.executions().mark_parked(id, token, step, now - slack - 1_000).await.unwrap());
    let token = match f.admit_parked(id, step, None).await {
        Claimed::Held { token } => token,
        other => panic!("a marker past its time lets a copy in: {other:?}"),
    };

    // A cancel request lets any delivery in, to end the step now.
    assert!(f.write(id, token, &Transition::new(ClaimAfter::Release("released"))).await);
    assert!(f.store.executions().mark_parked(id, token, step, now + 60_000).await.unwrap());
    assert_eq!(f.admit_parked(id, step, None).await, Claimed::Copy);
    let mut con = f.con.clone();
    let _: () = redis::cmd("HSET")
        .arg(f.keys.execution(id))
        .arg("cancel_requested")
        .arg(now)
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(matches!(f.admit_parked(id, step, None).await, Claimed::Held { .. }), "a cancel request lets a copy in");
    f.cleanup().await;
}
