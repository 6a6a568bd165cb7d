//! Agent turns end to end: streamed tokens over SSE in the seed's wire format, the tool-call loop
//! (signed callbacks, results back to the model, dead-lettered tools as errors), one turn at a time
//! per session with follow_up order and steer, broker-held retries of the provider, a worker
//! SIGKILLed mid-turn, and bad input. The provider is a small OpenAI-compatible server.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, post_turn, read_until_done, turn_body};
use fleet_tests::{spawn_fleet, wait_for, FleetOptions, Receiver, Reply};

const SECRET: &str = "whsec_turn_tests_secret_01";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_turn_streams_tokens_and_completes() {
    let llm = MockLlm::start(|_, _| LlmReply::Text {
        tokens: vec!["Hel".into(), "lo".into(), " world".into()],
        delay: Duration::from_millis(30),
    })
    .await;
    let hook = Receiver::start(SECRET, |_, _| Reply::status(200)).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let (status, _) = fleet
        .request(
            Method::PUT,
            "/v1/webhooks/room",
            Some(&json!({"url": hook.url("/room"), "secret": SECRET, "events": ["agent.room.message"]})),
        )
        .await;
    assert_eq!(status, 201);
    // Start reading first, then post: the reader sees the turn from its first token.
    let reader = read_until_done(&fleet, "s_plain", None);
    let (frames, id) = tokio::join!(reader, async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        post_turn(&fleet, &turn_body("s_plain", "hi there", &[])).await
    });
    let kinds: Vec<&str> = frames.iter().map(|(_, _, e, _)| e.as_str()).collect();
    assert_eq!(kinds, ["token", "token", "token", "message_complete", "done"]);
    let tokens: Vec<&str> = frames.iter().filter(|f| f.2 == "token").map(|f| f.3["token"].as_str().unwrap()).collect();
    assert_eq!(tokens, ["Hel", "lo", " world"]);
    assert_eq!(frames[1].3["index"], 1);
    let message = &frames[3].3["message"];
    assert_eq!(message["content"], "Hello world");
    assert_eq!(message["role"], "assistant");
    assert_eq!(frames[4].3["message_id"], message["id"]);
    assert!(frames[0].0.starts_with("id: ") && frames[0].0.contains("\nevent: token\ndata: {"), "{}", frames[0].0);

    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(10)).await;
    assert_eq!(done["kind"], "turn");
    assert_eq!(done["turn"]["final_message"]["content"], "Hello world");
    assert_eq!(done["turn"]["rounds"], 1);
    assert_eq!(done["turn"]["usage"], json!({"prompt_tokens": 11, "completion_tokens": 3}), "usage from the stream");
    let sent = &llm.requests()[0];
    assert_eq!(sent.body["model"], "test-model");
    assert_eq!(sent.body["stream"], true);
    assert_eq!(sent.body["temperature"], 0.2);
    assert_eq!(sent.authorization.as_deref(), Some("Bearer sk-test-key"));
    assert_eq!(sent.messages()[0]["role"], "system");

    // Resume after the first token: the rest of the turn, nothing before it.
    let resumed = read_until_done(&fleet, "s_plain", Some(&frames[0].1)).await;
    let kinds: Vec<&str> = resumed.iter().map(|(_, _, e, _)| e.as_str()).collect();
    assert_eq!(kinds, ["token", "token", "message_complete", "done"]);

    // The final message is delivered as a signed agent.room.message webhook.
    let delivered = wait_for("the agent.room.message webhook", Duration::from_secs(10), || async {
        hook.received().into_iter().find(|r| r.json["event"] == "agent.room.message")
    })
    .await;
    delivered.verified.as_ref().unwrap();
    assert_eq!(delivered.json["data"]["message"]["content"], "Hello world");
    assert_eq!(delivered.json["data"]["room_id"], "s_plain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_go_out_signed_and_results_return_to_the_model() {
    let llm = MockLlm::start(|body, _| {
        let tool_messages = body["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "tool").count();
        if tool_messages == 0 {
            LlmReply::ToolCalls(vec![
                ("call_1".into(), "search".into(), r#"{"query":"laptop"}"#.into()),
                ("call_2".into(), "broken".into(), r#"{"query":"x"}"#.into()),
                ("call_3".into(), "forbidden".into(), r#"{}"#.into()),
            ])
        } else {
            LlmReply::text("Found one laptop.")
        }
    })
    .await;
    let search =
        Receiver::start(SECRET, |r, _| Reply::result(json!({"hits": [r.json["parameters"]["query"].clone()]}))).await;
    let broken = Receiver::start(SECRET, |_, _| Reply::status(404)).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    fleet.register_tool("search", &search.url("/search"), SECRET).await;
    fleet.register_tool("broken", &broken.url("/broken"), SECRET).await;
    fleet.register_tool("forbidden", &search.url("/forbidden"), SECRET).await;
    let id = post_turn(&fleet, &turn_body("s_tools", "find a laptop", &["search", "broken"])).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["turn"]["final_message"]["content"], "Found one laptop.");
    assert_eq!(done["turn"]["rounds"], 2);
    assert_eq!(done["turn"]["tool_calls"].as_array().unwrap().len(), 3);

    // The callback is the seed's, signed, for the session and assistant.
    let calls = search.received();
    assert_eq!(calls.len(), 1, "the forbidden tool was never called");
    calls[0].verified.as_ref().unwrap();
    assert_eq!(calls[0].json["tool_name"], "search");
    assert_eq!(calls[0].json["parameters"], json!({"query": "laptop"}));
    assert_eq!(calls[0].json["room_id"], "s_tools");
    assert_eq!(calls[0].json["assistant_id"], "asst_1");
    assert_eq!(broken.received().len(), 1);

    // The second model call carries all three results: one success, two errors.
    let second = &llm.requests()[1];
    let tools: Vec<Value> = second.messages().into_iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(tools.len(), 3);
    let by_id =
        |id: &str| tools.iter().find(|m| m["tool_call_id"] == id).unwrap()["content"].as_str().unwrap().to_string();
    assert!(by_id("call_1").contains("laptop"), "{}", by_id("call_1"));
    assert!(by_id("call_2").contains("error") && by_id("call_2").contains("404"), "{}", by_id("call_2"));
    assert!(by_id("call_3").contains("not enabled"), "{}", by_id("call_3"));
    let assistant = second.messages().into_iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(assistant["tool_calls"].as_array().unwrap().len(), 3);
    assert_eq!(assistant["tool_calls"][0]["function"]["arguments"], r#"{"query":"laptop"}"#);
    assert!(second.body["tools"].as_array().unwrap().iter().any(|t| t["function"]["name"] == "search"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_turn_per_session_follow_up_in_order_and_steer_joins_the_running_turn() {
    let llm = MockLlm::start(|body, _| {
        let contents: Vec<String> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["content"].as_str().map(str::to_string))
            .collect();
        let has_tool_result = body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool");
        if contents.iter().any(|c| c == "steerable") && !has_tool_result {
            LlmReply::ToolCalls(vec![("call_s".into(), "slow".into(), r#"{"query":"s"}"#.into())])
        } else {
            LlmReply::Text { tokens: vec!["ok".into(), " done".into()], delay: Duration::from_millis(150) }
        }
    })
    .await;
    let slow =
        Receiver::start(SECRET, |_, _| Reply::result(json!("slow result")).after(Duration::from_millis(1200))).await;
    let fleet = spawn_fleet(llm_fleet(&llm).workers(2)).await;
    fleet.register_tool("slow", &slow.url("/slow"), SECRET).await;

    // Two follow-ups for one session, posted together, plus another session's turn.
    let first = post_turn(&fleet, &turn_body("s_serial", "first", &[])).await;
    let second = post_turn(&fleet, &turn_body("s_serial", "second", &[])).await;
    let other = post_turn(&fleet, &turn_body("s_other", "elsewhere", &[])).await;
    for id in [&first, &second, &other] {
        fleet.wait_status(id, "succeeded", Duration::from_secs(30)).await;
    }
    let requests = llm.requests();
    let of = |marker: &str| requests.iter().find(|r| r.contents().iter().any(|c| c == marker)).unwrap().clone();
    let (a, b) = (of("first"), of("second"));
    assert!(a.ended.unwrap() <= b.started, "the session's turns never overlap at the provider");
    assert!(a.started < b.started, "follow_up keeps arrival order");

    // A steer while a turn waits on its tool reaches that turn's next model call.
    let running = post_turn(&fleet, &turn_body("s_steer", "steerable", &["slow"])).await;
    wait_for("the running turn's tool call", Duration::from_secs(10), || async {
        (!slow.received().is_empty()).then_some(())
    })
    .await;
    let mut steer = turn_body("s_steer", "also consider the budget", &[]);
    steer["behavior"] = json!("steer");
    let steer_id = post_turn(&fleet, &steer).await;
    let steered = fleet.wait_status(&steer_id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(steered["result"]["steered"], true);
    fleet.wait_status(&running, "succeeded", Duration::from_secs(30)).await;
    let next_call = llm
        .requests()
        .into_iter()
        .find(|r| r.contents().iter().any(|c| c == "steerable") && r.messages().iter().any(|m| m["role"] == "tool"))
        .expect("the running turn's second model call");
    assert!(next_call.contents().iter().any(|c| c == "also consider the budget"), "{:?}", next_call.contents());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_errors_retry_on_the_broker_schedule_or_end_the_turn() {
    let llm = MockLlm::start(|body, n| {
        let contents: Vec<String> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["content"].as_str().map(str::to_string))
            .collect();
        if contents.iter().any(|c| c == "always 500") {
            LlmReply::Status(500)
        } else if n == 0 {
            LlmReply::Status(429)
        } else {
            LlmReply::Whole("recovered".into())
        }
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let id = post_turn(&fleet, &turn_body("s_retry", "hello", &[])).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(done["turn"]["final_message"]["content"], "recovered", "non-streamed answers work too");
    let attempts = done["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["http_status"], 429);
    assert_eq!(attempts[0]["outcome"], "retry");
    assert_eq!(attempts.last().unwrap()["outcome"], "success");
    let requests = llm.requests();
    let gap = requests[1].started - requests[0].started;
    assert!(gap >= Duration::from_millis(190), "the retry waited in the broker: {gap:?}");

    let reader = read_until_done(&fleet, "s_fail", None);
    let (frames, failing) = tokio::join!(reader, async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        post_turn(&fleet, &turn_body("s_fail", "always 500", &[])).await
    });
    let kinds: Vec<&str> = frames.iter().map(|(_, _, e, _)| e.as_str()).collect();
    // One `retry` per abandoned attempt (each under its own message id), then the error.
    assert_eq!(kinds, ["retry", "retry", "retry", "retry", "retry", "error", "done"]);
    let retried: std::collections::HashSet<&str> =
        frames[..5].iter().map(|f| f.3["message_id"].as_str().unwrap()).collect();
    assert_eq!(retried.len(), 5, "a new message id per attempt");
    assert_eq!(frames[5].3["error"]["code"], "llm_unavailable");
    let failed = fleet.wait_status(&failing, "dead_lettered", Duration::from_secs(5)).await;
    assert_eq!(failed["attempts"].as_array().unwrap().len(), 6, "six attempts on the schedule");
    let (status, dl) = fleet.get(&format!("/v1/dead-letters/{failing}")).await;
    assert_eq!(status, 200);
    assert_eq!(dl["data"]["kind"], "turn");
    assert_eq!(dl["data"]["reason"], "exhausted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_turn_hands_the_turn_to_another() {
    let llm = MockLlm::start(|body, _| {
        let has_tool_result = body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "tool");
        if has_tool_result {
            LlmReply::text("all done")
        } else {
            LlmReply::ToolCalls(vec![
                ("call_a".into(), "lookup".into(), r#"{"query":"a"}"#.into()),
                ("call_b".into(), "lookup".into(), r#"{"query":"b"}"#.into()),
            ])
        }
    })
    .await;
    // The first callback hangs so the test can kill the worker in the middle of the turn.
    let lookup = Receiver::start(SECRET, |_, n| {
        if n == 0 {
            Reply::result(json!("late")).after(Duration::from_secs(3))
        } else {
            Reply::result(json!("found"))
        }
    })
    .await;
    let mut fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_CLAIM_LEASE", "1")).await;
    fleet.register_tool("lookup", &lookup.url("/lookup"), SECRET).await;
    let id = post_turn(&fleet, &turn_body("s_kill", "look things up", &["lookup"])).await;
    wait_for("a tool callback in flight", Duration::from_secs(10), || async {
        (!lookup.received().is_empty()).then_some(())
    })
    .await;
    fleet.kill_worker(0);
    fleet.spawn_worker().await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["turn"]["final_message"]["content"], "all done");
    let calls = done["turn"]["tool_calls"].as_array().unwrap().clone();
    assert_eq!(calls.len(), 2);
    for call in calls {
        let exec = call["execution_id"].as_str().unwrap();
        assert_eq!(lookup.side_effects(exec), 1, "one side effect per execution id");
        let view = fleet.wait_status(exec, "succeeded", Duration::from_secs(5)).await;
        let successes = view["attempts"].as_array().unwrap().iter().filter(|a| a["outcome"] == "success").count();
        assert_eq!(successes, 1, "its result was stored once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_turns_get_a_4xx_naming_the_field() {
    let fleet = spawn_fleet(FleetOptions::default().workers(0)).await;
    let ok = turn_body("s", "hi", &[]);
    let check = |expected: u16, needle: &'static str, status: u16, body: Value| {
        assert_eq!(status, expected, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{message:?} should name {needle:?}");
    };
    let resp = fleet
        .http
        .post(format!("{}/v1/turns", fleet.api))
        .bearer_auth(&fleet.token)
        .body("{nope")
        .send()
        .await
        .unwrap();
    check(400, "JSON", resp.status().as_u16(), resp.json().await.unwrap());
    let mut b = ok.clone();
    b.as_object_mut().unwrap().remove("session_id");
    let (s, r) = fleet.post("/v1/turns", &b).await;
    check(422, "session_id", s, r);
    let mut b = ok.clone();
    b["assistant"]["model_config"]["temperature"] = json!(9);
    let (s, r) = fleet.post("/v1/turns", &b).await;
    check(422, "temperature", s, r);
    let mut b = ok.clone();
    b["messages"] = json!([]);
    let (s, r) = fleet.post("/v1/turns", &b).await;
    check(422, "messages", s, r);
    let mut b = ok.clone();
    b["behavior"] = json!("interrupt");
    let (s, r) = fleet.post("/v1/turns", &b).await;
    check(422, "behavior", s, r);
    let mut b = ok.clone();
    b["messages"][0]["content"] = json!(42);
    let (s, r) = fleet.post("/v1/turns", &b).await;
    check(422, "messages[0].content", s, r);
    // A missing model is the fleet's default (tests/tests/fleet/turn_inputs.rs); an empty one is refused.
    let mut b = ok;
    b["assistant"]["model_config"]["model"] = json!("");
    let (s, r) = fleet.post("/v1/turns", &b).await;
    check(422, "assistant.model_config.model", s, r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_are_bounded() {
    let llm = MockLlm::start(|_, n| {
        LlmReply::ToolCalls(vec![(format!("call_{n}"), "echo".into(), r#"{"query":"again"}"#.into())])
    })
    .await;
    let echo = Receiver::echo(SECRET).await;
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_TURN_MAX_ROUNDS", "3")).await;
    fleet.register_tool("echo", &echo.url("/echo"), SECRET).await;
    let id = post_turn(&fleet, &turn_body("s_loop", "loop forever", &["echo"])).await;
    let failed = fleet.wait_status(&id, "dead_lettered", Duration::from_secs(20)).await;
    assert_eq!(llm.requests().len(), 3, "three model rounds, then the turn stops");
    assert_eq!(echo.received().len(), 3);
    assert!(failed["turn"]["rounds"].as_u64().unwrap() >= 3);
    let (_, dl) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
    assert!(dl["data"]["last_error"].as_str().unwrap().contains("3 model rounds"), "{dl}");
}
