//! The enqueue path's idempotency: an unconfirmed publish keeps its execution and its
//! `Idempotency-Key`, a crashed dispatcher's reservation expires, a failed key write after the
//! broker's confirm still answers 202, and a key reused with another body is refused.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use fleet_tests::proxy::Proxy;
use fleet_tests::{metric, spawn_fleet, wait_for, Fleet, FleetOptions, Receiver};

const SECRET: &str = "whsec_acceptance_secret_1";

fn broker_proxy_url(proxy: &Proxy) -> String {
    format!("amqp://guest:guest@{}/%2f", proxy.addr)
}

/// A second copy of a job that arrives while the first runs is parked for the rest of the claim's
/// lease: short leases and delays keep that wait short.
fn short_parks(options: FleetOptions) -> FleetOptions {
    options.env("FLEET_CLAIM_LEASE", "3").env("FLEET_RETRY_DELAYS", "0.5,1")
}

/// `POST /v1/tool-calls` with an `Idempotency-Key`: status and body.
async fn post_with_key(fleet: &Fleet, key: &str, body: &Value) -> (u16, Value) {
    let resp = fleet
        .http
        .post(format!("{}/v1/tool-calls", fleet.api))
        .bearer_auth(&fleet.token)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .expect("dispatcher reachable");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// Waits until worker 0 has consumed `copies` messages of the tool-call kind that ended as a
/// success or a duplicate, so a second copy of a job has been seen before calls are counted.
async fn wait_consumed(fleet: &Fleet, copies: f64) {
    wait_for(&format!("{copies} tool-call deliveries to finish"), Duration::from_secs(30), || async {
        let m = fleet.worker_metrics(0).await;
        let done = metric(&m, "fleet_jobs_finished_total{kind=\"tool_call\",outcome=\"success\"}")
            + metric(&m, "fleet_jobs_finished_total{kind=\"tool_call\",outcome=\"duplicate\"}");
        (done >= copies).then_some(())
    })
    .await;
}

/// Raw Redis access to the fleet's keys (the test inspects what the dispatcher left behind).
async fn redis_keys(fleet: &Fleet, pattern: &str) -> Vec<String> {
    let client = redis::Client::open(fleet_tests::redis_url()).unwrap();
    let mut con = fleet_tests::redis_connection(&client).await;
    redis::cmd("KEYS").arg(format!("{}{pattern}", fleet.key_prefix)).query_async(&mut con).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_publish_keeps_its_execution_and_its_key() {
    let receiver = Receiver::echo(SECRET).await;
    let proxy = Proxy::start("127.0.0.1:5672".parse().unwrap()).await;
    // Long enough that even a loaded machine gets the publish onto the wire before it times out.
    let mut options = short_parks(FleetOptions::default().env("FLEET_PUBLISH_TIMEOUT", "4"));
    options.dispatcher_amqp_url = Some(broker_proxy_url(&proxy));
    let fleet = Arc::new(spawn_fleet(options).await);
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let body = json!({"tool_name": "echo", "parameters": {"query": "once"}});

    // The publish reaches the broker (the worker runs it) but its confirm never comes back.
    proxy.freeze_replies();
    let first = tokio::spawn({
        let (fleet, body) = (fleet.clone(), body.clone());
        async move { post_with_key(&fleet, "unconfirmed-1", &body).await }
    });
    wait_consumed(&fleet, 1.0).await;
    let (first_status, first) = first.await.unwrap();
    proxy.thaw();
    let first_id = first["error"]["execution_id"].as_str().unwrap_or("").to_string();
    let (record_status, _) = fleet.get(&format!("/v1/executions/{first_id}")).await;

    let (retry_status, retry) = post_with_key(&fleet, "unconfirmed-1", &body).await;
    let retry_id = retry["data"]["execution_id"].as_str().unwrap_or("").to_string();
    wait_consumed(&fleet, 2.0).await;
    let calls = receiver.received().len();
    let observed = format!(
        "first: {first_status} {first}; record of the first: {record_status}; retry: {retry_status} {retry}; \
         receiver calls: {calls}"
    );
    eprintln!("observed: {observed}");
    assert_eq!(first_status, 503, "{observed}");
    assert_eq!(first["error"]["code"], "outcome_unknown", "{observed}");
    assert!(first_id.starts_with("exec_"), "the 503 names the execution: {observed}");
    assert!(first["error"]["message"].as_str().unwrap_or("").contains("same Idempotency-Key"), "{observed}");
    assert_eq!(record_status, 200, "the record is kept: {observed}");
    assert_eq!(retry_status, 202, "{observed}");
    assert_eq!(retry_id, first_id, "the retry returns the same execution: {observed}");
    assert_eq!(calls, 1, "the job ran exactly once: {observed}");
    fleet.wait_status(&first_id, "succeeded", Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_dispatchers_reservation_expires_with_the_publish_timeout() {
    const PUBLISH_TIMEOUT: Duration = Duration::from_secs(2);
    let receiver = Receiver::echo(SECRET).await;
    let proxy = Proxy::start("127.0.0.1:5672".parse().unwrap()).await;
    let mut options = FleetOptions::default().env("FLEET_PUBLISH_TIMEOUT", "2");
    options.dispatcher_amqp_url = Some(broker_proxy_url(&proxy));
    let mut fleet = spawn_fleet(options).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let body = json!({"tool_name": "echo", "parameters": {"query": "crash"}});

    // Nothing reaches the broker: the dispatcher hangs in its publish, then is SIGKILLed there.
    proxy.freeze();
    let request = {
        let (http, url, token, body) =
            (fleet.http.clone(), format!("{}/v1/tool-calls", fleet.api), fleet.token.clone(), body.clone());
        tokio::spawn(async move {
            http.post(url).bearer_auth(token).header("Idempotency-Key", "crash-1").json(&body).send().await
        })
    };
    let crashed_id = wait_for("the execution record of the request in flight", Duration::from_secs(10), || async {
        // `execution:{<prefix>idempotency:<id>}`: the record takes its claim key's name as its tag.
        let keys = redis_keys(&fleet, "execution:*").await;
        keys.first().and_then(|k| k.split(['{', '}']).nth(1)).and_then(|tag| tag.rsplit(':').next()).map(str::to_string)
    })
    .await;
    assert_eq!(redis_keys(&fleet, "request:*").await.len(), 1, "the key is reserved");
    fleet.stop_dispatcher(libc::SIGKILL, Duration::from_secs(10)).await;
    let crashed_at = Instant::now();
    assert!(request.await.unwrap().is_err(), "the crashed dispatcher answered nothing");
    fleet.start_dispatcher(None).await;

    let (first_status, first) = post_with_key(&fleet, "crash-1", &body).await;
    let mut last = (first_status, first.clone());
    let accepted = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let (status, resp) = post_with_key(&fleet, "crash-1", &body).await;
            if status != 409 {
                return (status, resp);
            }
            last = (status, resp);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let waited = crashed_at.elapsed();
    eprintln!("observed: first retry {first_status} {first}; after {waited:?}: {accepted:?} (last {last:?})");
    let (status, resp) = accepted.unwrap_or_else(|_| panic!("still {last:?} {waited:?} after the crash"));
    assert_eq!(status, 202, "{resp}");
    assert_eq!(resp["data"]["execution_id"], crashed_id.as_str(), "the same execution: {resp}");
    assert!(waited < PUBLISH_TIMEOUT + Duration::from_secs(10), "accepted {waited:?} after the crash");
    fleet.wait_status(&crashed_id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(receiver.received().len(), 1, "one call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_key_write_after_the_brokers_confirm_still_answers_202() {
    let receiver = Receiver::echo(SECRET).await;
    let broker = Proxy::start("127.0.0.1:5672".parse().unwrap()).await;
    let redis = Proxy::start("127.0.0.1:6379".parse().unwrap()).await;
    let mut options = short_parks(FleetOptions::default())
        .workers(0)
        .env("FLEET_PUBLISH_TIMEOUT", "5")
        .env("FLEET_REDIS_TIMEOUT", "1")
        .env("FLEET_REDIS_URL", &format!("redis://{}/0", redis.addr));
    options.dispatcher_amqp_url = Some(broker_proxy_url(&broker));
    let mut fleet = spawn_fleet(options).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let body = json!({"tool_name": "echo", "parameters": {"query": "confirmed"}});

    // Hold the confirm until the job is on the queue and Redis is cut, then let it through.
    broker.freeze_replies();
    let request = {
        let (http, url, token, body) =
            (fleet.http.clone(), format!("{}/v1/tool-calls", fleet.api), fleet.token.clone(), body.clone());
        tokio::spawn(async move {
            let resp =
                http.post(url).bearer_auth(token).header("Idempotency-Key", "confirmed-1").json(&body).send().await;
            let resp = resp.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        })
    };
    wait_for("the job on the work queue", Duration::from_secs(10), || async {
        (fleet.waiting_depth(fleet_protocol::envelope::JobKind::ToolCall).await == 1).then_some(())
    })
    .await;
    redis.cut();
    broker.thaw();
    let (status, resp) = request.await.unwrap();
    redis.restore();
    eprintln!("observed: {status} {resp}");
    assert_eq!(status, 202, "the broker confirmed the job: {resp}");
    let id = resp["data"]["execution_id"].as_str().unwrap().to_string();

    // The key was not confirmed; once its reservation expires a retry gets the same execution.
    let again = wait_for("the retry to be answered", Duration::from_secs(30), || async {
        let (status, resp) = post_with_key(&fleet, "confirmed-1", &body).await;
        (status != 409).then_some((status, resp))
    })
    .await;
    assert_eq!(again.0, 202, "{}", again.1);
    assert_eq!(again.1["data"]["execution_id"], id.as_str(), "{}", again.1);
    fleet.spawn_worker().await;
    wait_consumed(&fleet, 2.0).await;
    assert_eq!(receiver.received().len(), 1, "the job ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_a_different_body_is_refused() {
    let receiver = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    fleet.register_tool("echo", &receiver.url("/echo"), SECRET).await;
    let body = json!({"tool_name": "echo", "parameters": {"query": "a"}});
    let (status, first) = post_with_key(&fleet, "reused-1", &body).await;
    assert_eq!(status, 202, "{first}");

    let other = json!({"tool_name": "echo", "parameters": {"query": "b"}});
    let (status, resp) = post_with_key(&fleet, "reused-1", &other).await;
    eprintln!("observed: {status} {resp}");
    assert_eq!(status, 422, "{resp}");
    assert_eq!(resp["error"]["code"], "idempotency_key_reused", "{resp}");
    assert!(resp["error"]["message"].as_str().unwrap().contains("Idempotency-Key"), "{resp}");

    // The same body again is still the first execution.
    let (status, again) = post_with_key(&fleet, "reused-1", &body).await;
    assert_eq!(status, 202, "{again}");
    assert_eq!(again["data"]["execution_id"], first["data"]["execution_id"]);
}

/// `POST /v1/turns` honours `Idempotency-Key` as tool calls do. The same key and body give the
/// same execution (one model call, the replay marked), another body is refused with 422, and the
/// session's line is left free for the next turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_honour_the_idempotency_key_like_tool_calls() {
    use fleet_tests::llm::{LlmReply, MockLlm};
    use fleet_tests::turn::{llm_fleet, post_turn, turn_body};

    let llm = MockLlm::start(|_, _| LlmReply::text("once")).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let post = |body: Value| {
        let fleet = &fleet;
        async move {
            let resp = fleet
                .http
                .post(format!("{}/v1/turns", fleet.api))
                .bearer_auth(&fleet.token)
                .header("Idempotency-Key", "turn-key-1")
                .json(&body)
                .send()
                .await
                .expect("dispatcher reachable");
            let (status, replayed) = (resp.status().as_u16(), resp.headers().contains_key("idempotent-replayed"));
            (status, replayed, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let body = turn_body("s_keyed", "hello once", &[]);
    let (first_status, _, first) = post(body.clone()).await;
    let first_id = first["data"]["execution_id"].as_str().unwrap_or("").to_string();
    fleet.wait_status(&first_id, "succeeded", Duration::from_secs(20)).await;
    let (again_status, again_replayed, again) = post(body.clone()).await;
    let mut other_body = body.clone();
    other_body["messages"][0]["content"] = json!("hello twice");
    let (other_status, _, other) = post(other_body).await;
    let observed = format!(
        "first: {first_status} {first}; same key and body: {again_status} replayed={again_replayed} {again}; \
         another body: {other_status} {other}; model calls so far: {}",
        llm.requests().len()
    );
    eprintln!("observed: {observed}");
    assert_eq!(first_status, 202, "{observed}");
    assert_eq!(again_status, 202, "{observed}");
    assert_eq!(again["data"]["execution_id"], first_id.as_str(), "the same execution: {observed}");
    assert!(again_replayed, "the replay is marked: {observed}");
    assert_eq!(again["data"]["status"], "succeeded", "a replay reports the current status: {observed}");
    assert_eq!(other_status, 422, "{observed}");
    assert_eq!(other["error"]["code"], "idempotency_key_reused", "{observed}");

    // The line is free: a later turn of the session runs, and the model ran once per execution.
    let next = post_turn(&fleet, &turn_body("s_keyed", "next", &[])).await;
    fleet.wait_status(&next, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(llm.requests().len(), 2, "{observed}");
}

/// `Idempotency-Key` on a turn, the uncertain case: a turn whose publish is never confirmed keeps
/// its record and its place in the session's line; the job that did reach the broker runs once, a
/// retry with the key names that execution, and the session's next turn is not held up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_turn_keeps_its_execution_and_its_line() {
    use fleet_tests::llm::{LlmReply, MockLlm};
    use fleet_tests::turn::{llm_fleet, post_turn, turn_body};

    let llm = MockLlm::start(|_, _| LlmReply::text("once")).await;
    let proxy = Proxy::start("127.0.0.1:5672".parse().unwrap()).await;
    // Long enough that even a loaded machine gets the publish onto the wire before it times out.
    let mut options = llm_fleet(&llm).env("FLEET_PUBLISH_TIMEOUT", "4");
    options.dispatcher_amqp_url = Some(broker_proxy_url(&proxy));
    let fleet = Arc::new(spawn_fleet(options).await);
    let post = |body: Value| {
        let fleet = fleet.clone();
        async move {
            let resp = fleet
                .http
                .post(format!("{}/v1/turns", fleet.api))
                .bearer_auth(&fleet.token)
                .header("Idempotency-Key", "turn-unconfirmed-1")
                .json(&body)
                .send()
                .await
                .expect("dispatcher reachable");
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let body = turn_body("s_unconfirmed", "hello", &[]);
    proxy.freeze_replies();
    let first = tokio::spawn(post(body.clone()));
    wait_for("the turn's model call", Duration::from_secs(30), || async { (!llm.requests().is_empty()).then_some(()) })
        .await;
    let (first_status, first) = first.await.unwrap();
    proxy.thaw();
    let first_id = first["error"]["execution_id"].as_str().unwrap_or("").to_string();
    let (record_status, _) = fleet.get(&format!("/v1/executions/{first_id}")).await;
    let observed = format!("first: {first_status} {first}; record of the first: {record_status}");
    eprintln!("observed: {observed}");
    assert_eq!(first_status, 503, "{observed}");
    assert_eq!(first["error"]["code"], "outcome_unknown", "{observed}");
    assert_eq!(record_status, 200, "the record is kept: {observed}");
    fleet.wait_status(&first_id, "succeeded", Duration::from_secs(20)).await;

    let (retry_status, retry) = post(body).await;
    let observed = format!("{observed}; retry: {retry_status} {retry}");
    eprintln!("observed: {observed}");
    assert_eq!(retry_status, 202, "{observed}");
    assert_eq!(retry["data"]["execution_id"], first_id.as_str(), "the same execution: {observed}");
    let next = post_turn(&fleet, &turn_body("s_unconfirmed", "next", &[])).await;
    fleet.wait_status(&next, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(llm.requests().len(), 2, "one model call per execution: {observed}");
}
