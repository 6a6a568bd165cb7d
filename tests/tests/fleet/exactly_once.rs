//! Each effect once, whatever copies arrive: a copy of a job arriving at any moment of its life
//! (waiting for a retry, polled, dead-lettered, running) is only acked, a turn's tool calls are its
//! own whatever ids the model gives, and a turn's writes sit behind its step's fence. Beside them,
//! one test each: a record kept as long as it is needed and final before `done`, a stream backlog
//! and a model's error body bounded, errors sanitised, metric labels bounded.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

use fleet_protocol::envelope::JobKind;
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::proxy::{Proxy, Trigger};
use fleet_tests::tap::JobTap;
use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
use fleet_tests::{metric, spawn_fleet, wait_for, Fleet, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_exactly_once_secret_1";

async fn register_with_retry(fleet: &Fleet, name: &str, url: &str, retry: Value) {
    let body = json!({
        "name": name, "description": "a test tool",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        "callback_url": url, "callback_secret": SECRET, "retry": retry,
    });
    let (status, resp) = fleet.request(reqwest::Method::PUT, &format!("/v1/tools/{name}"), Some(&body)).await;
    assert!(status == 200 || status == 201, "{status} {resp}");
}

/// The copies worker `index` has recognised (and only acked) so far, of `kind`.
async fn copies_seen(fleet: &Fleet, index: usize, kind: &str) -> f64 {
    metric(&fleet.worker_metrics(index).await, &format!("fleet_duplicate_deliveries_total{{kind=\"{kind}\"}}"))
}

/// Waits until worker 0 has dealt with a copy of a `kind` job: it counted the copy, or (where a copy
/// still runs) `ran_again` says the copy had its effect. Either way the test then asserts.
async fn wait_copy_handled(fleet: &Fleet, kind: &str, ran_again: impl Fn() -> bool) {
    wait_for("the copy to be handled", Duration::from_secs(30), || async {
        (ran_again() || copies_seen(fleet, 0, kind).await >= 1.0).then_some(())
    })
    .await;
}

async fn execution(fleet: &Fleet, id: &str) -> Value {
    let (code, body) = fleet.get(&format!("/v1/executions/{id}")).await;
    assert_eq!(code, 200, "{body}");
    body["data"].clone()
}

/// Tool calls without ids run once in each round. A model that gives its tool calls no ids (the
/// fleet names them `call_0`, … per completion) calls `echo` in two rounds. The second round's
/// call is not taken for the first's: each is POSTed once, and the model reads each round's own
/// result, not alpha's twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_without_ids_run_once_in_each_round() {
    let llm = MockLlm::start(|body, _| {
        let results = body["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "tool").count();
        match results {
            0 => LlmReply::ToolCalls(vec![(String::new(), "echo".into(), r#"{"query":"alpha"}"#.into())]),
            1 => LlmReply::ToolCalls(vec![(String::new(), "echo".into(), r#"{"query":"bravo"}"#.into())]),
            _ => LlmReply::text("both done"),
        }
    })
    .await;
    let echo = Receiver::start(SECRET, |r, _| Reply::result(json!({"echo": r.json["parameters"]["query"]}))).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    fleet.register_tool("echo", &echo.url("/echo"), SECRET).await;
    let id = post_turn(&fleet, &turn_body("s_idless", "echo twice", &["echo"])).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;

    let queries: Vec<Value> = echo.received().iter().map(|r| r.json["parameters"]["query"].clone()).collect();
    assert_eq!(queries, vec![json!("alpha"), json!("bravo")], "one POST per round's call");
    let requests = llm.requests();
    assert_eq!(requests.len(), 3, "two rounds of calls, then the answer");
    let results: Vec<String> = requests[2]
        .messages()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results[0].contains("alpha") && results[1].contains("bravo"), "each round its own result: {results:?}");
    let ids: Vec<Value> =
        requests[2].messages().iter().filter(|m| m["role"] == "tool").map(|m| m["tool_call_id"].clone()).collect();
    assert_ne!(ids[0], ids[1], "the model can tell the two results apart");
}

/// A copy during a retry wait sends nothing. A tool has its own schedule (20 s between attempts)
/// and its receiver answers 500. A copy of the call's first job arrives while the call is
/// `retrying`: the tool owner gets no second POST, and the record is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_during_a_retry_wait_sends_nothing() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(500)).await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    register_with_retry(&fleet, "flaky", &receiver.url("/flaky"), json!({"attempts": 3, "delays": [20, 20]})).await;
    let tap = JobTap::start(&fleet).await;
    let id = fleet.call_tool("flaky", json!({"query": "x"})).await;
    fleet.wait_status(&id, "retrying", Duration::from_secs(20)).await;
    let first = tap.first("the call's first job", |t| t.execution_id() == id).await;

    tap.republish(&first).await;
    wait_copy_handled(&fleet, "tool_call", || receiver.received_for(&id).len() > 1).await;
    assert_eq!(receiver.received_for(&id).len(), 1, "the copy sent nothing");
    let view = execution(&fleet, &id).await;
    assert_eq!(view["status"], "retrying", "{view}");
    assert_eq!(view["attempts"].as_array().unwrap().len(), 1, "the record is unchanged: {view}");
}

/// A copy during a poll sends nothing. A copy of the original job (a POST, not a poll) arrives
/// while the broker holds the poll of a 202. The claim says `polling`; the copy must not POST
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_during_a_poll_sends_nothing() {
    let receiver = Receiver::start(SECRET, |r, _| match r.path.as_str() {
        "/slow" => Reply {
            status: 202,
            body: json!({"status_url": format!("/status/{}", r.execution_id())}).to_string(),
            delay: Duration::ZERO,
            headers: vec![],
        },
        _ => Reply { status: 202, body: r#"{"status":"pending"}"#.into(), delay: Duration::ZERO, headers: vec![] },
    })
    .await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_ASYNC_POLL_INTERVAL", "0.5")).await;
    fleet.register_tool("slow", &receiver.url("/slow"), SECRET).await;
    let tap = JobTap::start(&fleet).await;
    let id = fleet.call_tool("slow", json!({"query": "x"})).await;
    let posts = || receiver.received_for(&id).iter().filter(|r| r.path == "/slow").count();
    wait_for("the status URL polled", Duration::from_secs(20), || async {
        (receiver.received_for(&id).iter().any(|r| r.path.starts_with("/status/"))).then_some(())
    })
    .await;
    let first = tap.first("the call's first job", |t| t.execution_id() == id && t.json["poll"].is_null()).await;

    tap.republish(&first).await;
    wait_copy_handled(&fleet, "tool_call", || posts() > 1).await;
    assert_eq!(posts(), 1, "the copy sent nothing");
}

/// A copy after the dead letter revives nothing. A copy of a dead-lettered call's job arrives. The
/// claim says `dead_lettered`; the call must not run again unless an operator asks, and the dead
/// letter stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_after_the_dead_letter_revives_nothing() {
    let receiver = Receiver::start(SECRET, |_, _| Reply::status(400)).await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("broken", &receiver.url("/broken"), SECRET).await;
    let tap = JobTap::start(&fleet).await;
    let id = fleet.call_tool("broken", json!({"query": "x"})).await;
    fleet.wait_status(&id, "dead_lettered", Duration::from_secs(20)).await;
    let first = tap.first("the call's first job", |t| t.execution_id() == id).await;

    tap.republish(&first).await;
    wait_copy_handled(&fleet, "tool_call", || receiver.received_for(&id).len() > 1).await;
    assert_eq!(receiver.received_for(&id).len(), 1, "the copy sent nothing");
    let view = execution(&fleet, &id).await;
    assert_eq!(view["status"], "dead_lettered", "{view}");
    let (code, dead) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
    assert_eq!(code, 200, "the dead letter stays: {dead}");
}

/// A replayed turn is not swallowed by a late copy of its step. A turn whose model call fails for
/// good is dead-lettered; a late copy of its step arrives; the operator fixes the model and retries
/// the dead letter; a follow-up turn is posted. The copy must not mark the step done, the retry is
/// not taken for a duplicate, and both turns succeed: the session is not blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_turn_is_not_swallowed_by_a_late_copy_of_its_step() {
    let fixed = Arc::new(AtomicBool::new(false));
    let llm = MockLlm::start({
        let fixed = fixed.clone();
        move |_, _| if fixed.load(Ordering::SeqCst) { LlmReply::text("fine now") } else { LlmReply::Status(400) }
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let tap = JobTap::start(&fleet).await;
    let first = post_turn(&fleet, &turn_body("s_replay", "hello", &[])).await;
    fleet.wait_status(&first, "dead_lettered", Duration::from_secs(20)).await;
    let step = tap.first("the turn's step", |t| t.execution_id() == first).await;

    tap.republish(&step).await;
    let duplicate = "fleet_jobs_finished_total{kind=\"turn\",outcome=\"duplicate\"}";
    wait_for("the copy to be handled", Duration::from_secs(20), || async {
        let text = fleet.worker_metrics(0).await;
        (metric(&text, duplicate) >= 1.0 || copies_seen(&fleet, 0, "turn").await >= 1.0).then_some(())
    })
    .await;
    assert_eq!(execution(&fleet, &first).await["status"], "dead_lettered", "the copy revived nothing");

    fixed.store(true, Ordering::SeqCst);
    let (code, body) = fleet.post(&format!("/v1/dead-letters/{first}/retry"), &json!({})).await;
    assert!(code == 200 || code == 202, "{code} {body}");
    let follow_up = post_turn(&fleet, &turn_body("s_replay", "and then?", &[])).await;
    fleet.wait_status(&first, "succeeded", Duration::from_secs(30)).await;
    fleet.wait_status(&follow_up, "succeeded", Duration::from_secs(30)).await;
}

/// A refused retry publish keeps the schedule. The worker's own retry publish is refused (the
/// tool-call delay queues are gone, so it comes back unroutable). Requeuing the delivery would
/// re-send the attempt at once, again and again, until the delivery limit dead-lettered the call
/// (10 POSTs in 6 s where the schedule allows 3). The call must keep its schedule while the broker
/// refuses, and go on when it accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_retry_publish_keeps_the_schedule() {
    let receiver =
        Receiver::start(SECRET, |_, n| if n == 0 { Reply::status(500) } else { Reply::result(json!("ok")) }).await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_RETRY_DELAYS", "1,2,4,8,16")).await;
    fleet.register_tool("flaky", &receiver.url("/flaky"), SECRET).await;
    let (conn, channel) = fleet.amqp().await;
    let delay_queues: Vec<_> =
        fleet.topology.queues().into_iter().filter(|q| q.name.contains(".delay.tool_calls.")).collect();
    for q in &delay_queues {
        channel.queue_delete(q.name.as_str().into(), Default::default()).await.unwrap();
    }
    let id = fleet.call_tool("flaky", json!({"query": "x"})).await;
    let held = "fleet_outcome_publish_retries_total{kind=\"tool_call\"}";
    wait_for("the refused retry to be tried again, or the call sent again", Duration::from_secs(30), || async {
        let tried = metric(&fleet.worker_metrics(0).await, held);
        (tried >= 3.0 || receiver.received_for(&id).len() >= 3).then_some(())
    })
    .await;
    assert_eq!(receiver.received_for(&id).len(), 1, "nothing is sent again while the retry is refused");
    let view = execution(&fleet, &id).await;
    assert_eq!(view["status"], "retrying", "{view}");
    let (_, dead) = fleet.get("/v1/dead-letters").await;
    assert_eq!(dead["data"], json!([]), "nothing was dead-lettered");

    // The queues come back: the schedule goes on.
    fleet_platform::broker::declare_topology(&channel, &fleet.topology).await.unwrap();
    let _ = conn.close(200, "".into()).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(receiver.received_for(&id).len(), 2, "attempt 2 ran once");
}

/// What a task reading a stream needs of the fleet: its address, token and HTTP client.
type Api = (String, String, reqwest::Client);

fn api(fleet: &Fleet) -> Api {
    (fleet.api.clone(), fleet.token.clone(), fleet.http.clone())
}

/// SSE frames of `session`'s stream from its first event, with the time each arrived, until
/// `dones` `done` events were read.
async fn frames_until(at: Api, session: &str, dones: usize) -> Vec<(Instant, Value)> {
    let (api, token, http) = at;
    let resp = http
        .get(format!("{api}/v1/sessions/{session}/stream"))
        .bearer_auth(&token)
        .header("Last-Event-ID", "0-0")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut bytes = resp.bytes_stream();
    let (mut buf, mut frames, mut seen) = (String::new(), Vec::new(), 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen < dones {
        let chunk =
            tokio::time::timeout_at(deadline, bytes.next()).await.expect("the stream went on").unwrap().unwrap();
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            let Some(data) = frame.lines().find_map(|l| l.strip_prefix("data: ")) else { continue };
            let data: Value = serde_json::from_str(data).unwrap();
            seen += usize::from(data["type"] == "done");
            frames.push((Instant::now(), data));
        }
    }
    frames
}

/// The next turn starts as soon as the first is done. Two turns run back to back on one session.
/// The first turn's finish frees the session and wakes the second: the second does not wait for
/// its parked copy (the first retry delay, here 5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_turn_starts_as_soon_as_the_first_is_done() {
    let llm = MockLlm::start(|_, n| match n {
        0 => LlmReply::text("one").after(Duration::from_millis(500)),
        _ => LlmReply::text("two"),
    })
    .await;
    let options = llm_fleet(&llm).env("FLEET_RETRY_DELAYS", "5,5,5,5,5");
    let fleet = spawn_fleet(options).await;
    let reading = tokio::spawn(frames_until(api(&fleet), "s_back_to_back", 2));
    let first = post_turn(&fleet, &turn_body("s_back_to_back", "first", &[])).await;
    let second = post_turn(&fleet, &turn_body("s_back_to_back", "second", &[])).await;
    let frames = reading.await.unwrap();
    fleet.wait_status(&second, "succeeded", Duration::from_secs(20)).await;
    let first_done = frames.iter().find(|(_, f)| f["type"] == "done").map(|(at, _)| *at).unwrap();
    let done_id = frames.iter().find(|(_, f)| f["type"] == "done").unwrap().1["message_id"].clone();
    let second_token = frames
        .iter()
        .find(|(_, f)| f["type"] == "token" && f["message_id"] != done_id && f["token"].as_str() == Some("two"))
        .map(|(at, _)| *at)
        .expect("the second turn streamed");
    let gap = second_token.duration_since(first_done);
    assert!(gap < Duration::from_secs(1), "the second turn started {gap:?} after the first's done");
    let _ = first;
}

/// What a newer claim of `turn`'s step writes first, done by hand: its claim's token moves one
/// past the current one, and so does the fence it registers on the turn (the turn state's fence
/// key, or, where the record shares the claim's slot and the claim writes it in the same script,
/// the record's fence).
async fn advance_fences(fleet: &Fleet, turn: &str) {
    let mut con = fleet.redis().await;
    // (Before the record moved beside its claim, a step's claim had an id of its own, derived from
    // the turn and the round, and the turn's state a fence key of its own: this test bumped those.)
    let mut keys = fleet.redis_keys(&format!("idempotency:{turn}")).await;
    keys.extend(fleet.redis_keys(&format!("execution:{{*idempotency:{turn}}}")).await);
    const BUMP: &str = r#"
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'hash' then
  local f = redis.call('HGET', KEYS[1], 'fence')
  if f then redis.call('HSET', KEYS[1], 'fence', tonumber(f) + 1) return 1 end
  return 0
end
if t ~= 'string' then return 0 end
local raw = redis.call('GET', KEYS[1])
if tonumber(raw) then redis.call('SET', KEYS[1], tonumber(raw) + 1, 'KEEPTTL') return 1 end
local ok, v = pcall(cjson.decode, raw)
if ok and type(v) == 'table' and v.token then
  v.token = tonumber(v.token) + 1
  redis.call('SET', KEYS[1], cjson.encode(v), 'KEEPTTL')
  return 1
end
return 0
"#;
    let mut bumped = 0;
    for key in keys {
        let n: i64 = redis::Script::new(BUMP).key(&key).invoke_async(&mut con).await.unwrap();
        bumped += n;
    }
    assert!(bumped >= 2, "the claim and the fence of {turn} were not found");
}

/// A fenced-off step neither remembers nor frees the session. While a step's model call is held, a
/// newer claim of the step fences it off; then the model answers. The stale step must write
/// nothing: no answer in the session's history, and the session still locked. Checking the turn id
/// alone would let both writes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_off_step_neither_remembers_nor_frees_the_session() {
    let llm = MockLlm::start(|_, _| LlmReply::text("stale answer").after(Duration::from_secs(2))).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let id = post_turn(&fleet, &turn_body("s_fenced", "hello", &[])).await;
    wait_for("the model call", Duration::from_secs(20), || async { (!llm.requests().is_empty()).then_some(()) }).await;
    advance_fences(&fleet, &id).await;

    wait_for("the stale step to end fenced", Duration::from_secs(20), || async {
        let text = fleet.worker_metrics(0).await;
        (metric(&text, "fleet_jobs_finished_total{kind=\"turn\",outcome=\"fenced\"}") >= 1.0).then_some(())
    })
    .await;
    let mut con = fleet.redis().await;
    let lock = fleet.redis_keys("*session:{s_fenced}:lock").await;
    assert_eq!(lock.len(), 1, "the session is still locked");
    let holder: String = redis::cmd("GET").arg(&lock[0]).query_async(&mut con).await.unwrap();
    assert!(holder.contains(&id), "the lock still names the turn: {holder}");
    for key in fleet.redis_keys("*session:{s_fenced}:history*").await {
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut con).await.unwrap();
        if kind == "list" {
            let entries: Vec<String> =
                redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).query_async(&mut con).await.unwrap();
            assert!(!entries.iter().any(|e| e.contains("stale answer")), "history holds the stale answer: {entries:?}");
        }
    }
}

/// A step run again streams under a new message id. A worker dies while its model call streams;
/// another worker runs the step again. Each model call streams under its own id, and an abandoned
/// one is announced, so a client never sees "t0 t1 t2 t0 t1 …" under one id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_run_again_streams_under_a_new_message_id() {
    let text: String = (0..16).map(|i| format!("t{i} ")).collect();
    let llm = MockLlm::start({
        let text = text.clone();
        move |_, _| LlmReply::Text {
            tokens: text.split_inclusive(' ').map(str::to_string).collect(),
            delay: Duration::from_millis(150),
        }
    })
    .await;
    let mut fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_CLAIM_LEASE", "2")).await;
    let reading = tokio::spawn(frames_until(api(&fleet), "s_rerun", 1));
    let id = post_turn(&fleet, &turn_body("s_rerun", "count", &[])).await;
    wait_for("a few tokens", Duration::from_secs(20), || async {
        let started = llm.requests().first().map(|r| r.started.elapsed() > Duration::from_millis(500));
        started.unwrap_or(false).then_some(())
    })
    .await;
    fleet.kill_worker(0);
    fleet.spawn_worker().await;
    let frames: Vec<Value> = reading.await.unwrap().into_iter().map(|(_, f)| f).collect();
    fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;

    let complete = frames.iter().find(|f| f["type"] == "message_complete").expect("message_complete");
    let final_id = complete["message"]["id"].clone();
    let final_tokens: String = frames
        .iter()
        .filter(|f| f["type"] == "token" && f["message_id"] == final_id)
        .map(|f| f["token"].as_str().unwrap())
        .collect();
    assert_eq!(final_tokens, text, "the final message's tokens, once");
    let abandoned = frames.iter().find(|f| f["type"] == "token" && f["message_id"] != final_id);
    let abandoned = abandoned.expect("the first call's tokens streamed")["message_id"].clone();
    let announced = frames.iter().position(|f| f["type"] == "retry" && f["message_id"] == abandoned);
    let first_final = frames.iter().position(|f| f["type"] == "token" && f["message_id"] == final_id).unwrap();
    assert!(announced.is_some_and(|at| at < first_final), "the abandoned call is announced before the new one streams");
}

/// A lost claim key does not stall the call. The claim key is lost (a Redis failover drops a
/// write) while the record keeps its fence. A claim restarting at token 1 would be fenced off by
/// the record and acked without running, leaving the call `retrying` for ever. The call goes on and
/// succeeds at its third attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_claim_key_does_not_stall_the_call() {
    let receiver =
        Receiver::start(SECRET, |_, n| if n < 2 { Reply::status(500) } else { Reply::result(json!("third time")) })
            .await;
    let fleet = spawn_fleet(FleetOptions::default().env("FLEET_RETRY_DELAYS", "2,2,2,2,2")).await;
    fleet.register_tool("flaky", &receiver.url("/flaky"), SECRET).await;
    let id = fleet.call_tool("flaky", json!({"query": "x"})).await;
    wait_for("two attempts", Duration::from_secs(20), || async {
        let view = execution(&fleet, &id).await;
        (view["status"] == "retrying" && view["attempts"].as_array().unwrap().len() == 2).then_some(())
    })
    .await;
    let mut con = fleet.redis().await;
    let deleted: i64 =
        redis::cmd("DEL").arg(format!("{}idempotency:{id}", fleet.key_prefix)).query_async(&mut con).await.unwrap();
    assert_eq!(deleted, 1, "the claim key existed");

    fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(receiver.received_for(&id).len(), 3);
}

/// A call due in 30 days keeps its record until then. A call may be scheduled 30 days ahead. Its
/// record lives at least until the job is due plus 7 days, so GET and cancel still find it (a
/// record of 7 days would answer 404 from day 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_due_in_thirty_days_keeps_its_record_until_then() {
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    fleet.register_tool("later", &receiver.url("/later"), SECRET).await;
    let (code, resp) = fleet
        .post(
            "/v1/tool-calls",
            &json!({"tool_name": "later", "parameters": {"query": "x"}, "delay_seconds": 30 * 86_400}),
        )
        .await;
    assert_eq!(code, 202, "{resp}");
    let id = resp["data"]["execution_id"].as_str().unwrap();
    let mut con = fleet.redis().await;
    let records: Vec<String> = fleet
        .redis_keys(&format!("*execution:*{id}*"))
        .await
        .into_iter()
        .filter(|k| !k.ends_with(":attempts"))
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    let ttl: i64 = redis::cmd("TTL").arg(&records[0]).query_async(&mut con).await.unwrap();
    assert!(ttl >= 37 * 86_400 - 120, "the record lives {ttl} s, less than the 30 days until due plus 7");
}

/// The claim and result scripts raise a record's TTL with one `EXPIRE GT` (a check and a set
/// cost two calls each time): a record that lost its TTL still gets one, and the claim, the record
/// and its attempts all live the 7 days past the call's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_call_keeps_its_claim_record_and_attempts_seven_days() {
    let receiver = Receiver::echo(SECRET).await;
    let mut fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    fleet.register_tool("kept", &receiver.url("/kept"), SECRET).await;
    let id = fleet.call_tool("kept", json!({"query": "x"})).await;
    let keys = fleet_protocol::keys::Keys::new(fleet.key_prefix.clone());
    let mut con = fleet.redis().await;
    let persisted: i64 = redis::cmd("PERSIST").arg(keys.execution(&id)).query_async(&mut con).await.unwrap();
    assert_eq!(persisted, 1, "the new record had a TTL to remove");
    fleet.spawn_worker().await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    let week = fleet_protocol::IDEMPOTENCY_TTL_SECS as i64;
    for key in [keys.idempotency(&id), keys.execution(&id), keys.attempts(&id)] {
        let ttl: i64 = redis::cmd("TTL").arg(&key).query_async(&mut con).await.unwrap();
        assert!((week - 120..=week).contains(&ttl), "{key} lives {ttl} s, not the 7 days past the call's end");
    }
}

/// A provider's error is sanitised in the stream and the log. Its body holds credentials in a URL,
/// a query-string key and a stack trace: none of them reaches the `retry` event or the worker's
/// log. The error still says where it came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_error_is_sanitised_in_the_stream_and_the_log() {
    let raw = "upstream https://admin:hunter2@llm.internal/v1/x?api_key=sk-live-123 failed\n    at Object.<anonymous> (/srv/app/secret-path.js:1:1)";
    let llm = MockLlm::start(move |_, n| match n {
        0 => LlmReply::StatusBody(500, raw.to_string()),
        _ => LlmReply::text("recovered"),
    })
    .await;
    let mut options = llm_fleet(&llm);
    options.capture_logs = true;
    let fleet = spawn_fleet(options).await;
    let reading = tokio::spawn(frames_until(api(&fleet), "s_sanitised", 1));
    let id = post_turn(&fleet, &turn_body("s_sanitised", "hi", &[])).await;
    let frames = reading.await.unwrap();
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    let retry = frames.iter().find(|(_, f)| f["type"] == "retry").expect("a retry event").1.to_string();
    let logs = fleet.logs();
    for secret in ["hunter2", "sk-live-123", "secret-path.js"] {
        assert!(!retry.contains(secret), "the retry event carries {secret}: {retry}");
        assert!(!logs.contains(secret), "the log carries {secret}");
    }
    assert!(retry.contains("llm.internal"), "the error still says where: {retry}");
}

/// A steer is not lost when the step that took it fails. The running turn's next step takes a
/// steer, and the step's save fails (Redis cut off right after the take). The take has emptied the
/// steer list, yet the steer reaches a model call and the steering turn succeeds: it does not stay
/// `queued` for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_is_not_lost_when_the_step_that_took_it_fails() {
    let proxy = Proxy::start("127.0.0.1:6379".parse().unwrap()).await;
    let llm = MockLlm::start(|body, n| {
        let steered = body.to_string().contains("steer me");
        match (n, steered) {
            (0, _) => LlmReply::text("first").after(Duration::from_secs(2)),
            (_, true) => LlmReply::text("steered"),
            _ => LlmReply::text("plain"),
        }
    })
    .await;
    let options = llm_fleet(&llm)
        .env("FLEET_REDIS_URL", &format!("redis://{}/0", proxy.addr))
        .env("FLEET_CLAIM_LEASE", "3")
        .env("FLEET_REDIS_TIMEOUT", "0.5");
    let fleet = spawn_fleet(options).await;
    let running = post_turn(&fleet, &turn_body("s_steer_lost", "start", &[])).await;
    wait_for("the first model call", Duration::from_secs(20), || async { (!llm.requests().is_empty()).then_some(()) })
        .await;
    let mut steer = turn_body("s_steer_lost", "steer me", &[]);
    steer["behavior"] = json!("steer");
    let steering = post_turn(&fleet, &steer).await;
    wait_for("the steer to wait for the running turn", Duration::from_secs(20), || async {
        let mut con = fleet.redis().await;
        let keys = fleet.redis_keys("*session:{s_steer_lost}:steer").await;
        let n: i64 = match keys.first() {
            Some(k) => redis::cmd("LLEN").arg(k).query_async(&mut con).await.unwrap(),
            None => 0,
        };
        (n > 0).then_some(())
    })
    .await;
    // The step takes the steers with its session (one script): its keys name the history's
    // sequence, then the steer list (a finish's name other history keys after the sequence).
    let steer_key = fleet.redis_keys("*session:{s_steer_lost}:steer").await.remove(0);
    let seq_key = format!("{}:history_seq", steer_key.strip_suffix(":steer").unwrap());
    let take = format!("{seq_key}\r\n${}\r\n{steer_key}\r\n", steer_key.len());
    proxy.arm(&[take.as_bytes()], Trigger::CutAfterReply(Duration::from_secs(2)));

    fleet.wait_status(&running, "succeeded", Duration::from_secs(60)).await;
    fleet.wait_status(&steering, "succeeded", Duration::from_secs(60)).await;
    assert!(proxy.fired(), "the take was cut off");
    assert!(
        llm.requests().iter().any(|r| r.contents().iter().any(|c| c.contains("steer me"))),
        "the steer reached the model"
    );
}

/// The oldest-job age returns to 0 after a steer. A steered turn leaves the waiting set; were it
/// left there, the oldest-job-age gauge would grow for ever after a single steer (and its alert
/// fire). After the work ends, the gauge is 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_job_age_returns_to_zero_after_a_steer() {
    let llm = MockLlm::start(|_, n| match n {
        0 => LlmReply::text("a").after(Duration::from_secs(1)),
        _ => LlmReply::text("b"),
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_STATS_INTERVAL", "0.2")).await;
    let running = post_turn(&fleet, &turn_body("s_age", "start", &[])).await;
    wait_for("the first model call", Duration::from_secs(20), || async { (!llm.requests().is_empty()).then_some(()) })
        .await;
    let mut steer = turn_body("s_age", "also this", &[]);
    steer["behavior"] = json!("steer");
    let steering = post_turn(&fleet, &steer).await;
    fleet.wait_status(&running, "succeeded", Duration::from_secs(20)).await;
    fleet.wait_status(&steering, "succeeded", Duration::from_secs(20)).await;

    let series = "fleet_oldest_job_age_seconds{kind=\"turn\"}";
    wait_for("the oldest-job age back at 0", Duration::from_secs(10), || async {
        let text = fleet.http.get(format!("{}/metrics", fleet.api)).send().await.unwrap().text().await.unwrap();
        (text.lines().any(|l| l == format!("{series} 0"))).then_some(())
    })
    .await;
}

/// An endless error body from the model is cut at its bound. A provider answers 500 with a body
/// that never ends. Bounding only successes would hold the attempt until the model timeout: an
/// error body is read up to a bound too, and the attempt fails at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_error_body_from_the_model_is_cut_at_its_bound() {
    let llm = MockLlm::start(|_, _| LlmReply::EndlessError(500)).await;
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_LLM_TIMEOUT", "60")).await;
    let id = post_turn(&fleet, &turn_body("s_endless", "hi", &[])).await;
    let started = Instant::now();
    wait_for("the first attempt to fail", Duration::from_secs(15), || async {
        let view = execution(&fleet, &id).await;
        (!view["attempts"].as_array().unwrap().is_empty()).then_some(())
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(llm.error_bytes_sent() < 16 << 20, "the worker read {} bytes of one error", llm.error_bytes_sent());
}

/// A stream backlog is sent in pages. `since=start` must not load the whole retained stream (up to
/// 1,000 events of up to 1 MiB) into memory for every connection: 12 clients that stop reading a
/// 48 MiB backlog cost the dispatcher about a page each, not the backlog each. (A first page of 16
/// events, 16 MiB of these, came to 320–359 MiB in all, over the test's bound of then, 320 MiB, in
/// 3 runs of 4; a first page of 4 events: 107–124 MiB.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_backlog_is_sent_in_pages() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    let mut con = fleet.redis().await;
    let key = format!("{}session:{{s_backlog}}:events", fleet.key_prefix);
    let big = "x".repeat(1 << 20);
    for i in 0..48 {
        let event = json!({"type": "token", "token": big, "index": i, "message_id": "msg_backlog"}).to_string();
        let _: String =
            redis::cmd("XADD").arg(&key).arg("*").arg("data").arg(event).query_async(&mut con).await.unwrap();
    }
    let addr = fleet.api.trim_start_matches("http://").to_string();
    let mut clients = Vec::new();
    for _ in 0..12 {
        let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let request = format!(
            "GET /v1/sessions/s_backlog/stream?since=start HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\r\n",
            fleet.token
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut head = [0u8; 256];
        let n = socket.read(&mut head).await.unwrap();
        assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"), "the stream opened");
        clients.push(socket);
    }
    let pid = fleet.dispatcher_pid().unwrap();
    let rss = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .unwrap()
            .trim()
            .trim_end_matches(" kB")
            .parse::<u64>()
            .unwrap()
    };
    let mut peak = 0;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        peak = peak.max(rss());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(peak < 200 * 1024, "the dispatcher holds {} MiB for 12 stalled streams", peak / 1024);
    drop(clients);
}

/// A fleet whose Redis (through a proxy) holds the worker's `succeeded` write 1.5 s, with the
/// worker's Redis timeout `timeout_secs`; its model answers at once.
async fn success_write_held(timeout_secs: &str) -> (Proxy, MockLlm, fleet_tests::Fleet) {
    let proxy = Proxy::start("127.0.0.1:6379".parse().unwrap()).await;
    let llm = MockLlm::start(|_, _| LlmReply::text("quick")).await;
    let redis = format!("redis://{}/0", proxy.addr);
    let fleet =
        spawn_fleet(llm_fleet(&llm).env("FLEET_REDIS_URL", &redis).env("FLEET_REDIS_TIMEOUT", timeout_secs)).await;
    proxy.arm(&[b"succeeded"], Trigger::Delay(Duration::from_millis(1500)));
    (proxy, llm, fleet)
}

/// The record is final before `done` is streamed, so a client reading the execution right after
/// `done` never sees `running`. Here the worker's record write is held for a moment: the record
/// must still be final before `done` reaches the client. The hold stays well inside the worker's
/// Redis timeout (10 s here): this test is about order. A hold past the timeout is the next test's
/// (`a_final_write_that_timed_out_but_landed_is_announced_at_once`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_is_final_before_done_is_streamed() {
    let (proxy, _llm, fleet) = success_write_held("10").await;
    let reading = tokio::spawn(frames_until(api(&fleet), "s_final", 1));
    let id = post_turn(&fleet, &turn_body("s_final", "hi", &[])).await;
    reading.await.unwrap();
    let view = execution(&fleet, &id).await;
    assert_eq!(view["status"], "succeeded", "read right after done: {view}");
    assert!(proxy.fired());
}

/// A final write that timed out but landed is announced at once. The worker gives up on a turn's
/// `succeeded` write (its Redis timeout passed), though Redis applied it. Were the step to take it
/// for failed and park, its parked delivery would find the record owing the announcement under the
/// step's own lease and wait that out (60 s) before streaming `done`. The write is held 1.5 s past
/// a 1 s timeout: `done` must follow within seconds, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_write_that_timed_out_but_landed_is_announced_at_once() {
    let (proxy, _llm, fleet) = success_write_held("1").await;
    let reading = tokio::spawn(frames_until(api(&fleet), "s_landed", 1));
    let posted = Instant::now();
    let id = post_turn(&fleet, &turn_body("s_landed", "hi", &[])).await;
    let frames = reading.await.unwrap();
    let done_after = frames.last().unwrap().0 - posted;
    assert!(proxy.fired(), "the write was held");
    assert!(done_after < Duration::from_secs(15), "done came {done_after:?} after the turn was posted");
    assert_eq!(execution(&fleet, &id).await["status"], "succeeded");
    // Announced once: once the record owes nothing, the session's stream holds one of each.
    let record = fleet.redis_keys(&format!("execution:{{*idempotency:{id}}}")).await.remove(0);
    wait_for("the announcement retired", Duration::from_secs(20), || async {
        let owed: Option<String> =
            redis::cmd("HGET").arg(&record).arg("owed").query_async(&mut fleet.redis().await).await.unwrap();
        owed.unwrap_or_default().is_empty().then_some(())
    })
    .await;
    let events = fleet.redis_keys("session:{s_landed}:events").await.remove(0);
    let entries: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg(&events).arg("-").arg("+").query_async(&mut fleet.redis().await).await.unwrap();
    let kind = |t: &str| {
        entries.iter().filter(|(_, f)| f.iter().any(|(_, v)| v.contains(&format!("\"type\":\"{t}\"")))).count()
    };
    assert_eq!((kind("done"), kind("message_complete")), (1, 1), "{entries:?}");
}

/// The `model` label is bounded: it is the configured model, else `other`. It never takes the
/// string a client sent, which would make one series per made-up model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_label_is_bounded() {
    let llm = MockLlm::start(|_, _| LlmReply::text("hi")).await;
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_LLM_DEFAULT_MODEL", "test-model")).await;
    let mut body = turn_body("s_label", "hi", &[]);
    body["assistant"]["model_config"]["model"] = json!("made-up-model-7");
    let id = post_turn(&fleet, &body).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    let id = post_turn(&fleet, &turn_body("s_label", "again", &[])).await;
    fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    let text = fleet.worker_metrics(0).await;
    assert!(!text.contains("made-up-model-7"), "a client's model name is a label");
    assert!(text.contains("model=\"other\""), "an unconfigured model is `other`");
    assert!(text.contains("model=\"test-model\""), "the configured model keeps its name");
}

/// The copies a test fleet's first job makes: every delivery's job runs once (a sanity check on the
/// tap itself: nothing is counted as a copy when nothing was copied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_copies_nothing_is_counted_as_one() {
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("plain", &receiver.url("/plain"), SECRET).await;
    let calls = AtomicUsize::new(0);
    for _ in 0..5 {
        let id = fleet.call_tool("plain", json!({"query": "x"})).await;
        fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
        calls.fetch_add(1, Ordering::SeqCst);
    }
    assert_eq!(copies_seen(&fleet, 0, JobKind::ToolCall.as_str()).await, 0.0);
    assert_eq!(receiver.total_side_effects() as usize, calls.load(Ordering::SeqCst));
}
