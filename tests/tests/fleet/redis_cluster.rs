//! The callback pipeline on a Redis Cluster (the local 3-master cluster on 127.0.0.1:7000-7002
//! that `scripts/ensure-services.sh` starts): registry, claims, results, retries, dead letters and
//! `Idempotency-Key` all work when the keys are spread over several masters.

use std::time::Duration;

use serde_json::json;

use fleet_tests::{spawn_fleet, wait_for, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_cluster_test_secret";
/// The cluster's seed nodes (`FLEET_TEST_REDIS_CLUSTER_URL` names another cluster).
fn cluster() -> String {
    std::env::var("FLEET_TEST_REDIS_CLUSTER_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callback_pipeline_runs_on_redis_cluster() {
    let receiver = Receiver::start(SECRET, |r, n| {
        if r.json["parameters"]["query"] == "flaky" && n == 0 {
            Reply::status(503)
        } else if r.json["parameters"]["query"] == "gone" {
            Reply::status(404)
        } else {
            Reply::result(json!({"ok": r.json["parameters"]["query"].clone()}))
        }
    })
    .await;
    let fleet = spawn_fleet(
        FleetOptions::default().workers(2).env("FLEET_REDIS_URL", &cluster()).env("FLEET_RETRY_DELAYS", "0.2,0.4"),
    )
    .await;
    fleet.register_tool("clustered", &receiver.url("/c"), SECRET).await;
    let (status, tools) = fleet.get("/v1/tools").await;
    assert_eq!(status, 200);
    assert_eq!(tools["data"][0]["name"], "clustered");

    let mut ids = Vec::new();
    for n in 0..12 {
        ids.push(fleet.call_tool("clustered", json!({"query": format!("q{n}")})).await);
    }
    let flaky = fleet.call_tool("clustered", json!({"query": "flaky"})).await;
    let gone = fleet.call_tool("clustered", json!({"query": "gone"})).await;
    for id in &ids {
        fleet.wait_status(id, "succeeded", Duration::from_secs(20)).await;
        assert_eq!(receiver.side_effects(id), 1);
    }
    let done = fleet.wait_status(&flaky, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(done["attempts"].as_array().unwrap().len(), 2);
    fleet.wait_status(&gone, "dead_lettered", Duration::from_secs(20)).await;
    let (status, dl) = fleet.get(&format!("/v1/dead-letters/{gone}")).await;
    assert_eq!(status, 200);
    assert_eq!(dl["data"]["reason"], "permanent");
    // Listing (MGET), the per-id lock and removal work on the cluster too.
    let (status, listed) = fleet.get("/v1/dead-letters?reason=permanent").await;
    assert_eq!((status, listed["data"][0]["execution_id"].as_str()), (200, Some(gone.as_str())), "{listed}");
    // The executions index (one script on its slot) and a listing reading records across slots.
    let (status, executions) = fleet.get("/v1/executions?tool_name=clustered&limit=200").await;
    assert_eq!(status, 200, "{executions}");
    assert_eq!(executions["data"].as_array().unwrap().len(), ids.len() + 2);
    assert_eq!(executions["data"][0]["execution_id"].as_str(), Some(gone.as_str()));
    let (_, dead) = fleet.get("/v1/executions?status=dead_lettered").await;
    assert_eq!(dead["data"][0]["execution_id"].as_str(), Some(gone.as_str()), "{dead}");
    let (status, _) = fleet.request(reqwest::Method::DELETE, &format!("/v1/dead-letters/{gone}"), None).await;
    assert_eq!(status, 204);
    assert_eq!(fleet.get(&format!("/v1/dead-letters/{gone}")).await.0, 404);
    // The workers' activity reports (one script on the `{activity}` slot) and the console's read
    // of them (one pipeline): 13 successes, the retried attempt, the dead letter.
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let login = fleet_tests::console_login(&http, &fleet.api, &fleet.token, false).await;
    assert_eq!(login.status().as_u16(), 303);
    let cookie = login.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    wait_for("the overview to count what finished", Duration::from_secs(20), || async {
        let page = http.get(format!("{}/console", fleet.api)).header("cookie", &cookie).send().await.unwrap();
        let page = page.text().await.unwrap();
        let shown = ["succeeded-15m-tool_call\">13<", "failed-15m-tool_call\">1<", "dead_lettered-15m-tool_call\">1<"];
        shown.iter().all(|s| page.contains(s)).then_some(())
    })
    .await;

    // The idempotency keys really are spread over the cluster's masters.
    let mut holding = 0;
    for node in cluster().split(',') {
        let client = redis::Client::open(node).unwrap();
        let mut con = fleet_tests::redis_connection(&client).await;
        let keys: Vec<String> =
            redis::cmd("KEYS").arg(format!("{}idempotency:*", fleet.key_prefix)).query_async(&mut con).await.unwrap();
        holding += usize::from(!keys.is_empty());
    }
    assert!(holding >= 2, "idempotency keys on {holding} master(s)");

    // Idempotency-Key on the cluster too.
    let send = || async {
        let resp = fleet
            .http
            .post(format!("{}/v1/tool-calls", fleet.api))
            .bearer_auth(&fleet.token)
            .header("Idempotency-Key", "cluster-key-1")
            .json(&json!({"tool_name": "clustered", "parameters": {"query": "keyed"}}))
            .send()
            .await
            .unwrap();
        resp.json::<serde_json::Value>().await.unwrap()["data"]["execution_id"].as_str().unwrap().to_string()
    };
    assert_eq!(send().await, send().await);
}

/// A session id with braces runs on Redis Cluster. A session id with `{` or `}` keeps all its keys
/// in one slot; split across slots, its Lua scripts would fail with CROSSSLOT and its turns be
/// parked for ever. Every turn must finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_id_with_braces_runs_on_redis_cluster() {
    use fleet_tests::llm::{LlmReply, MockLlm};
    use fleet_tests::turn::{llm_fleet, post_turn, turn_body};

    let llm = MockLlm::start(|_, _| LlmReply::text("fine")).await;
    let mut options = llm_fleet(&llm).env("FLEET_REDIS_URL", &cluster());
    options.capture_logs = true;
    let fleet = spawn_fleet(options).await;
    let mut ids = Vec::new();
    // `%7Bodd%7D` is what `{odd}` encodes to: the two must not share a session.
    for session in ["}odd{", "{a}b", "{odd}", "%7Bodd%7D"] {
        ids.push((session, post_turn(&fleet, &turn_body(session, "hi", &[])).await));
    }
    for (session, id) in &ids {
        let done = tokio::time::timeout(
            Duration::from_secs(20),
            fleet.wait_status(id, "succeeded", Duration::from_secs(3600)),
        );
        if done.await.is_err() {
            let (_, body) = fleet.get(&format!("/v1/executions/{id}")).await;
            let crossslot = fleet.logs().matches("CROSSSLOT").count();
            panic!(
                "session {session:?}: turn {id} is {} after 20 s; CROSSSLOT in the fleet's logs {crossslot} times",
                body["data"]["status"]
            );
        }
    }
    assert_eq!(llm.requests().len(), ids.len(), "one model call per turn");
}

/// Session streams on the cluster: events appended on whichever master holds each session's slot
/// are announced to the dispatcher's one subscription, and each stream gets its own session's
/// turn, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_streams_deliver_turns_on_redis_cluster() {
    use fleet_tests::llm::{LlmReply, MockLlm};
    use fleet_tests::sse::{open_stream, SseReader};
    use fleet_tests::turn::{llm_fleet, post_turn, turn_body};

    let llm = MockLlm::start(|_, _| LlmReply::text("clustered stream reply")).await;
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_REDIS_URL", &cluster())).await;
    let http = reqwest::Client::new();
    let sessions = ["s_cl_a", "s_cl_b", "s_cl_c", "s_cl_d", "s_cl_e", "s_cl_f"];
    let mut readers = Vec::new();
    for session in sessions {
        let mut reader = SseReader::new(open_stream(&http, &fleet, session, "", &[]).await);
        reader.opened(Duration::from_secs(10)).await;
        readers.push(reader);
    }
    let mut ids = Vec::new();
    for session in sessions {
        ids.push(post_turn(&fleet, &turn_body(session, "hi", &[])).await);
    }
    for ((reader, id), session) in readers.iter_mut().zip(&ids).zip(sessions) {
        let frames = reader.until_done(Duration::from_secs(30)).await;
        let tokens: String =
            frames.iter().filter(|f| f.event == "token").map(|f| f.data["token"].as_str().unwrap()).collect();
        assert_eq!(tokens, "clustered stream reply", "{session}: {frames:?}");
        fleet.wait_status(id, "succeeded", Duration::from_secs(20)).await;
    }
    // The sessions' event streams really are on several masters, not only the subscriber's.
    let mut holding = 0;
    for node in cluster().split(',') {
        let client = redis::Client::open(node).unwrap();
        let mut con = fleet_tests::redis_connection(&client).await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}session:*:events", fleet.key_prefix))
            .query_async(&mut con)
            .await
            .unwrap();
        holding += usize::from(!keys.is_empty());
    }
    assert!(holding >= 2, "event streams on {holding} master(s)");
}

/// A provider's budget and a 429's pause on the cluster: the budget's keys share their provider's
/// hash tag, so its scripts run there; turns over the budget wait, the 429 pauses the provider, and
/// every turn ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_budgets_and_pauses_run_on_redis_cluster() {
    use fleet_tests::llm::{LlmReply, MockLlm};
    use fleet_tests::turn::{llm_fleet, post_turn, turn_body};

    let llm = MockLlm::start(|_, n| {
        if n == 1 {
            LlmReply::Status(429).header("retry-after", "1")
        } else {
            LlmReply::text("clustered budget reply")
        }
    })
    .await;
    let budget = r#"{"requests_per_minute": 240, "tokens_per_minute": 1000000, "burst_seconds": 1, "models": {"test-model": {"requests_per_minute": 600}}}"#;
    let options = llm_fleet(&llm).workers(2).env("FLEET_REDIS_URL", &cluster()).env("FLEET_LLM_BUDGET", budget);
    let fleet = spawn_fleet(options).await;
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(post_turn(&fleet, &turn_body(&format!("s_cl_budget_{n}"), "hi", &[])).await);
    }
    for id in &ids {
        fleet.wait_status(id, "succeeded", Duration::from_secs(30)).await;
    }
    let requests = llm.requests();
    assert_eq!(requests.len(), 7, "six turns and the refused call's retry");
    let refused = requests[1].ended.unwrap();
    // A step that took its slot before the worker wrote the pause (a few ms after the 429) still
    // calls; none may start later within the pause.
    let offsets: Vec<f64> = requests[2..]
        .iter()
        .filter(|r| r.started > refused)
        .map(|r| r.started.duration_since(refused).as_secs_f64())
        .collect();
    assert!(offsets.iter().all(|s| *s < 0.15 || *s >= 0.9), "no call during the 1 s pause: {offsets:.3?}");
}
