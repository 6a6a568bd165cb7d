//! A turn's life as one fenced state machine: nothing a turn needs next is acked away before it is
//! durable; one model request per (turn, round) even when the claim's lease is shorter than the
//! model call; a replayed dead-lettered turn runs its failed step again; a job the broker
//! dead-letters after too many deliveries still settles its turn and session; a session is held as
//! long as its turn lives; a steer outlives the failure of the turn it joined.

use std::time::Duration;

use serde_json::{json, Value};

use fleet_protocol::envelope::{Envelope, Job, JobKind, TurnJob};
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
use fleet_tests::{spawn_fleet, wait_for, Fleet, Receiver, Reply};

const SECRET: &str = "whsec_turn_life_secret_01";

fn has_tool_result(body: &Value) -> bool {
    body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool")
}

fn mentions(body: &Value, text: &str) -> bool {
    body["messages"].as_array().unwrap().iter().any(|m| m["content"].as_str().is_some_and(|c| c.contains(text)))
}

/// Waits for `status`, and on timeout says where the turn is and what the fleet logged.
async fn expect_status(fleet: &Fleet, id: &str, status: &str, within: Duration) -> Value {
    let waited = tokio::time::timeout(within, fleet.wait_status(id, status, Duration::from_secs(3600))).await;
    match waited {
        Ok(view) => view,
        Err(_) => {
            let (_, body) = fleet.get(&format!("/v1/executions/{id}")).await;
            panic!("{id} is {} after {within:?}, not {status}: {body}", body["data"]["status"]);
        }
    }
}

/// Waits until worker 0 has held a delivery of `kind` whose owed publish the broker refused, and
/// tried the publish again.
async fn wait_held_publish(fleet: &Fleet, kind: &str) {
    let series = format!("fleet_outcome_publish_retries_total{{kind=\"{kind}\"}}");
    wait_for(&series, Duration::from_secs(20), || async {
        (fleet_tests::metric(&fleet.worker_metrics(0).await, &series) >= 1.0).then_some(())
    })
    .await;
}

/// A model that calls `search` once, then answers.
fn search_then_answer() -> impl Fn(&Value, usize) -> LlmReply + Send + Sync + 'static {
    |body, _| {
        if has_tool_result(body) {
            LlmReply::text("answered")
        } else {
            LlmReply::ToolCalls(vec![("call_1".into(), "search".into(), r#"{"query":"q"}"#.into())])
        }
    }
}

/// A failed fan-out is retried, not acked away. The tool job's publish fails (returned
/// unroutable). The step is not marked done and acked, which would leave the turn `running` for
/// ever: it comes back and publishes the call once the broker takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fan_out_is_retried_not_acked_away() {
    let llm = MockLlm::start(search_then_answer()).await;
    let search = Receiver::start(SECRET, |_, _| Reply::result(json!("found"))).await;
    let mut options = llm_fleet(&llm);
    options.capture_logs = true;
    let fleet = spawn_fleet(options).await;
    fleet.register_tool("search", &search.url("/search"), SECRET).await;
    fleet.bind_work_queue(JobKind::ToolCall, false).await;

    let id = post_turn(&fleet, &turn_body("s_fanout", "find it", &["search"])).await;
    wait_held_publish(&fleet, "turn").await;
    fleet.bind_work_queue(JobKind::ToolCall, true).await;

    let view = expect_status(&fleet, &id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(view["result"]["message"]["content"], "answered");
    assert_eq!(search.received().len(), 1, "one callback for the one call");
    assert_eq!(llm.requests().len(), 2, "one model request per round");
}

/// A failed continuation is retried, not acked away. The last tool result's publish of the next
/// step fails. Acking the tool job would leave the turn `running` for ever: the tool job is settled
/// only once the next step is durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_continuation_is_retried_not_acked_away() {
    let llm = MockLlm::start(search_then_answer()).await;
    let search = Receiver::start(SECRET, |_, _| Reply::result(json!("found")).after(Duration::from_millis(1500))).await;
    let mut options = llm_fleet(&llm);
    options.capture_logs = true;
    let fleet = spawn_fleet(options).await;
    fleet.register_tool("search", &search.url("/search"), SECRET).await;

    let id = post_turn(&fleet, &turn_body("s_continue", "find it", &["search"])).await;
    wait_for("the tool's callback", Duration::from_secs(20), || async {
        (!search.received().is_empty()).then_some(())
    })
    .await;
    fleet.bind_work_queue(JobKind::Turn, false).await;
    wait_held_publish(&fleet, "tool_call").await;
    fleet.bind_work_queue(JobKind::Turn, true).await;

    let view = expect_status(&fleet, &id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(view["result"]["message"]["content"], "answered");
    assert_eq!(search.received().len(), 1, "the tool was not called again");
    assert_eq!(llm.requests().len(), 2, "one model request per round");
}

/// One model request per round, with a claim lease shorter than the model call. With a 1 s claim
/// lease and a 3 s model, duplicate copies of each step (as a wake or a redelivery makes them)
/// arrive after the lease would have lapsed. The claim is renewed during the model call, so no
/// second worker claims the step: exactly one model request per (turn, round), one callback per
/// tool call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_model_request_per_round_with_a_lease_shorter_than_the_model() {
    let llm = MockLlm::start(|body, _| search_then_answer()(body, 0).after(Duration::from_secs(3))).await;
    let search = Receiver::start(SECRET, |_, _| Reply::result(json!("found"))).await;
    let fleet = spawn_fleet(llm_fleet(&llm).workers(2).env("FLEET_CLAIM_LEASE", "1")).await;
    fleet.register_tool("search", &search.url("/search"), SECRET).await;

    let id = post_turn(&fleet, &turn_body("s_fenced", "find it", &["search"])).await;
    for round in 0..2u32 {
        wait_for("the round's model request", Duration::from_secs(20), || async {
            (llm.requests().len() > round as usize).then_some(())
        })
        .await;
        // Past the 1 s lease, while the model still thinks: a copy of the running step arrives.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let copy = Envelope::new(
            id.clone(),
            Job::Turn(TurnJob { session_id: "s_fenced".into(), round }),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64,
        );
        fleet.publish_envelope(&copy).await;
    }
    let view = expect_status(&fleet, &id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(view["result"]["message"]["content"], "answered");
    // Give a stray copy time to call the model (it would within a second), then count.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(llm.requests().len(), 2, "exactly one model request per round");
    assert_eq!(search.received().len(), 1, "one callback for the one call");
}

/// A replayed dead-lettered turn runs its failed step again. A turn dead-lettered by a permanent
/// model error is retried from the dead-letter queue after the model is fixed. The step's claim
/// does not stay `done` (the execution would read `queued` for ever): the failed step runs again
/// and the turn succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_dead_lettered_turn_runs_its_failed_step_again() {
    let llm = MockLlm::start(|_, n| if n == 0 { LlmReply::Status(400) } else { LlmReply::text("second chance") }).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let id = post_turn(&fleet, &turn_body("s_replay", "hello", &[])).await;
    expect_status(&fleet, &id, "dead_lettered", Duration::from_secs(30)).await;
    wait_for("the dead letter", Duration::from_secs(20), || async {
        (fleet.get(&format!("/v1/dead-letters/{id}")).await.0 == 200).then_some(())
    })
    .await;

    let (status, body) = fleet.post(&format!("/v1/dead-letters/{id}/retry"), &json!({})).await;
    assert!(status == 200 || status == 202, "{status} {body}");
    let view = expect_status(&fleet, &id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(view["result"]["message"]["content"], "second chance");
    assert_eq!(llm.requests().len(), 2);
    // The session moved on: a follow-up runs.
    let next = post_turn(&fleet, &turn_body("s_replay", "again", &[])).await;
    expect_status(&fleet, &next, "succeeded", Duration::from_secs(30)).await;
}

/// A turn the broker dead-letters settles and frees its session. A turn's first step is
/// dead-lettered by the broker's delivery limit (a consumer that keeps failing it). Storing a
/// record is not enough: the turn reads `dead_lettered`, with its record, and the session's next
/// turn runs (the lost turn does not stay first in line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_the_broker_dead_letters_settles_and_frees_its_session() {
    let llm = MockLlm::start(|_, _| LlmReply::text("fine")).await;
    // The light lane off: the turn's first delivery goes to the work queue the crashing consumer
    // takes from.
    let mut fleet = spawn_fleet(llm_fleet(&llm).workers(0).env("FLEET_LIGHT_LANE_RATE", "0")).await;
    let lost = post_turn(&fleet, &turn_body("s_limit", "lost", &[])).await;

    // A consumer that crashes on the job, again and again, until the broker gives up on it.
    let (conn, channel) = fleet.amqp().await;
    let queue = fleet.topology.work_queue(JobKind::Turn);
    let mut deliveries: i64 = 0;
    loop {
        let got =
            channel.basic_get(queue.as_str().into(), lapin::options::BasicGetOptions { no_ack: false }).await.unwrap();
        match got {
            Some(message) => {
                let requeue = lapin::options::BasicNackOptions { requeue: true, ..Default::default() };
                // Past the limit the dispatcher's drain hands the job back marked as decided: that
                // copy is the workers', not this crashing consumer's (on a busy machine it can
                // come back before this loop sees the queue empty).
                let body: Value = serde_json::from_slice(&message.delivery.data).unwrap_or_default();
                if !body["settle"].is_null() {
                    message.delivery.nack(requeue).await.unwrap();
                    break;
                }
                deliveries += 1;
                message.delivery.nack(requeue).await.unwrap();
            }
            // A requeued message may be briefly invisible to a get: only past the broker's limit
            // is an empty queue the end.
            None if deliveries >= fleet_protocol::topology::WORK_QUEUE_DELIVERY_LIMIT => break,
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
        assert!(deliveries < 100, "the broker never dead-lettered the job");
    }
    let _ = conn.close(200, "".into()).await;

    let next = post_turn(&fleet, &turn_body("s_limit", "next", &[])).await;
    fleet.spawn_worker().await;
    let view = expect_status(&fleet, &lost, "dead_lettered", Duration::from_secs(30)).await;
    assert_eq!(view["status"], "dead_lettered");
    let (status, record) = fleet.get(&format!("/v1/dead-letters/{lost}")).await;
    assert_eq!(status, 200, "{record}");
    expect_status(&fleet, &next, "succeeded", Duration::from_secs(30)).await;
    assert!(llm.requests().iter().all(|r| !mentions(&r.body, "lost")), "the lost turn never ran");
}

/// A session stays held while its turn waits on a slow tool. A session lock with a lease
/// (`FLEET_SESSION_LEASE`, here 2 s) would expire while a turn waits 5 s on its tool, letting the
/// session's next turn run at the same time. The session is held as long as its turn lives (the
/// setting is gone and ignored here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stays_held_while_its_turn_waits_on_a_slow_tool() {
    let llm = MockLlm::start(|body, _| {
        if mentions(body, "slow first") && !has_tool_result(body) {
            LlmReply::ToolCalls(vec![("call_1".into(), "search".into(), r#"{"query":"q"}"#.into())])
        } else {
            LlmReply::text("answered")
        }
    })
    .await;
    let search = Receiver::start(SECRET, |_, _| Reply::result(json!("found")).after(Duration::from_secs(5))).await;
    let fleet = spawn_fleet(llm_fleet(&llm).workers(2).env("FLEET_SESSION_LEASE", "2")).await;
    fleet.register_tool("search", &search.url("/search"), SECRET).await;

    let first = post_turn(&fleet, &turn_body("s_held", "slow first", &["search"])).await;
    wait_for("the tool's callback", Duration::from_secs(20), || async {
        (!search.received().is_empty()).then_some(())
    })
    .await;
    let second = post_turn(&fleet, &turn_body("s_held", "then second", &[])).await;
    expect_status(&fleet, &first, "succeeded", Duration::from_secs(30)).await;
    expect_status(&fleet, &second, "succeeded", Duration::from_secs(30)).await;

    // The second turn's requests carry the first exchange as history: tell them apart by its text.
    let requests = llm.requests();
    let first_done = requests
        .iter()
        .filter(|r| mentions(&r.body, "slow first") && !mentions(&r.body, "then second"))
        .map(|r| r.ended.unwrap())
        .max();
    let second_start = requests.iter().find(|r| mentions(&r.body, "then second")).map(|r| r.started);
    assert!(first_done.unwrap() <= second_start.unwrap(), "the second turn called the model while the first still ran");
}

/// A steer survives the failure of the turn it joined. A steer joins a running turn that then
/// fails. The steer is not marked `succeeded` and dropped, and the session does not stay locked
/// with its steer list pending: the steer's message runs as a turn of its own, and the session
/// moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_survives_the_failure_of_the_turn_it_joined() {
    let llm = MockLlm::start(|body, _| {
        if mentions(body, "doomed") {
            LlmReply::Status(400).after(Duration::from_millis(1500))
        } else {
            LlmReply::text("steer handled")
        }
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let doomed = post_turn(&fleet, &turn_body("s_steer_fail", "doomed", &[])).await;
    wait_for("the doomed model call", Duration::from_secs(20), || async { (!llm.requests().is_empty()).then_some(()) })
        .await;
    let mut steer = turn_body("s_steer_fail", "steer me", &[]);
    steer["behavior"] = json!("steer");
    let steer_id = post_turn(&fleet, &steer).await;

    expect_status(&fleet, &doomed, "dead_lettered", Duration::from_secs(30)).await;
    let view = expect_status(&fleet, &steer_id, "succeeded", Duration::from_secs(30)).await;
    wait_for("a model request with the steer", Duration::from_secs(20), || async {
        llm.requests().iter().any(|r| mentions(&r.body, "steer me") && !mentions(&r.body, "doomed")).then_some(())
    })
    .await;
    assert_eq!(view["result"]["message"]["content"], "steer handled", "{view}");
    let after = post_turn(&fleet, &turn_body("s_steer_fail", "after", &[])).await;
    expect_status(&fleet, &after, "succeeded", Duration::from_secs(30)).await;
}

/// Every way a turn's tool call ends reaches its turn, the delivery limit too: a worker dies during
/// the callback and the job's next delivery is past `FLEET_MAX_DELIVERIES` (1 here). The call is
/// dead-lettered without running again, and the model gets the error as the call's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_past_its_delivery_limit_is_answered_to_its_turn() {
    let llm = MockLlm::start(search_then_answer()).await;
    let search = Receiver::start(SECRET, |_, _| Reply::result(json!("late")).after(Duration::from_secs(60))).await;
    let mut fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_MAX_DELIVERIES", "1")).await;
    fleet.register_tool("search", &search.url("/search"), SECRET).await;

    let id = post_turn(&fleet, &turn_body("s_limit_call", "find it", &["search"])).await;
    wait_for("the tool's callback", Duration::from_secs(20), || async {
        (!search.received().is_empty()).then_some(())
    })
    .await;
    // The turn's step settles (and is acked) right after it published the call: only the tool
    // call may be in flight when the worker dies, or the step too would be past its limit.
    let settled = "fleet_jobs_finished_total{kind=\"turn\",outcome=\"success\"} 1";
    wait_for("the turn's step settled", Duration::from_secs(20), || async {
        fleet.worker_metrics(0).await.contains(settled).then_some(())
    })
    .await;
    fleet.kill_worker(0);
    fleet.spawn_worker().await;

    let view = expect_status(&fleet, &id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(view["result"]["message"]["content"], "answered");
    let call = search.received()[0].execution_id().to_string();
    // The turn is told first (the call's dead letter owes it), then the dead letter is stored and
    // the call's status written: the turn may finish before either.
    let record = wait_for("the call's dead letter", Duration::from_secs(20), || async {
        let (code, record) = fleet.get(&format!("/v1/dead-letters/{call}")).await;
        (code == 200).then_some(record)
    })
    .await;
    assert_eq!(record["data"]["reason"], "delivery_limit", "{record}");
    expect_status(&fleet, &call, "dead_lettered", Duration::from_secs(20)).await;
    let requests = llm.requests();
    let tool_message = requests[1].messages().into_iter().find(|m| m["role"] == "tool").expect("the call's result");
    assert!(tool_message["content"].as_str().unwrap().contains("delivered"), "{tool_message}");
    assert_eq!(search.received().len(), 1, "the call did not run again");
}
