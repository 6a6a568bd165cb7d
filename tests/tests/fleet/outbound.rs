//! What the worker's outgoing requests may do and what their answers may bring in: a model's
//! redirect is not followed (the conversation and its key go nowhere else), a secret the model
//! echoes back (its API key in an error body or in its text) is kept nowhere: not in Redis, an API
//! answer, the session's stream, a dead letter or the worker's log; and a credential in a tool
//! owner's error answer is redacted from the call's record.

use std::time::Duration;

use serde_json::Value;

use fleet_tests::fleet::redis_values_containing;
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{llm_fleet, post_turn, read_until_done, turn_body};
use fleet_tests::{spawn_fleet, Fleet, FleetOptions, Receiver, Reply};

/// The fleet's model key in these tests: distinctive, so finding it anywhere is a leak.
const KEY: &str = "sk-test-SECRET-0123456789abcdef";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_redirect_is_not_followed_and_ends_the_turn() {
    let elsewhere = MockLlm::start(|_, _| LlmReply::text("answered from elsewhere")).await;
    let location = format!("{}/chat/completions", elsewhere.base_url());
    let llm = MockLlm::start(move |_, _| LlmReply::Redirect(307, location.clone())).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;

    let id = post_turn(&fleet, &turn_body("s_redirect", "the whole conversation", &[])).await;
    let failed = fleet.wait_status(&id, "dead_lettered", Duration::from_secs(20)).await;
    assert_eq!(elsewhere.requests().len(), 0, "the redirect's target got nothing");
    assert_eq!(llm.requests().len(), 1, "a redirect is permanent: not tried again");
    let attempts = failed["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["http_status"], 307, "{failed}");
    let error = attempts[0]["error"].as_str().unwrap();
    assert!(error.contains("redirect") && error.contains("not followed"), "{error}");

    let (_, dead) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
    assert_eq!(dead["data"]["reason"], "permanent", "{dead}");
    let frames = read_until_done(&fleet, "s_redirect", Some("0-0")).await;
    let error = frames.iter().find(|f| f.2 == "error").expect("an error event");
    assert!(error.3.to_string().contains("redirect"), "{}", error.3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_echoed_in_a_model_error_is_kept_nowhere() {
    let llm = MockLlm::start(|_, _| LlmReply::StatusBody(401, format!("invalid api key {KEY}"))).await;
    let mut options = llm_fleet(&llm).env("FLEET_LLM_API_KEY", KEY);
    options.capture_logs = true;
    let fleet = spawn_fleet(options).await;

    let id = post_turn(&fleet, &turn_body("s_echo", "hello", &[])).await;
    let failed = fleet.wait_status(&id, "dead_lettered", Duration::from_secs(20)).await;
    assert_eq!(llm.requests()[0].authorization.as_deref(), Some(format!("Bearer {KEY}").as_str()));
    let frames = read_until_done(&fleet, "s_echo", Some("0-0")).await;
    assert!(frames.iter().any(|f| f.2 == "error"), "{frames:?}");
    let (_, dead_letters) = fleet.get("/v1/dead-letters").await;
    let (_, dead) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
    assert_kept_nowhere(&fleet, &[failed.clone(), dead_letters, dead], &frames).await;

    let error = failed["attempts"][0]["error"].as_str().unwrap();
    assert!(error.contains("HTTP 401") && error.contains("[redacted]"), "the error still says why: {error}");
    // The searches see what the fleet keeps: the redacted error is found where the key is not.
    assert!(!redis_values_containing(&fleet, "invalid api key [redacted]").await.is_empty());
    assert!(fleet.logs().contains("invalid api key [redacted]"), "the worker's log is captured");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_echoed_in_a_model_answer_is_kept_nowhere() {
    // The key is cut across two streamed tokens, as a model's tokenizer may cut it.
    let (head, tail) = KEY.split_at(12);
    let tokens = ["your key is ".to_string(), head.to_string(), tail.to_string(), ", keep it safe".to_string()];
    let llm = MockLlm::start(move |_, _| LlmReply::Text { tokens: tokens.to_vec(), delay: Duration::ZERO }).await;
    let mut options = llm_fleet(&llm).env("FLEET_LLM_API_KEY", KEY);
    options.capture_logs = true;
    let fleet = spawn_fleet(options).await;

    let id = post_turn(&fleet, &turn_body("s_echo_text", "what is my key?", &[])).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(20)).await;
    let frames = read_until_done(&fleet, "s_echo_text", Some("0-0")).await;
    let (status, messages) = fleet.get("/v1/sessions/s_echo_text/messages").await;
    assert_eq!(status, 200, "{messages}");
    assert_kept_nowhere(&fleet, &[done.clone(), messages], &frames).await;

    assert_eq!(done["turn"]["final_message"]["content"], "your key is [redacted], keep it safe", "{done}");
    let streamed: String = frames.iter().filter(|f| f.2 == "token").map(|f| f.3["token"].as_str().unwrap()).collect();
    assert_eq!(streamed, "your key is [redacted], keep it safe");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_a_tool_owners_error_are_redacted() {
    const TOOL_KEY: &str = "sk-live-0123456789abcdefghijk";
    let receiver = Receiver::start("whsec_outbound_tests_01", |_, _| Reply {
        body: format!("upstream refused Authorization: Bearer tok_live_0123456789abcdef (key {TOOL_KEY})"),
        ..Reply::status(400)
    })
    .await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    fleet.register_tool("echoing", &receiver.url("/echoing"), "whsec_outbound_tests_01").await;
    let id = fleet.call_tool("echoing", serde_json::json!({"query": "anything"})).await;
    let failed = fleet.wait_status(&id, "dead_lettered", Duration::from_secs(20)).await;
    let (_, dead) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
    for answer in [&failed, &dead] {
        let text = answer.to_string();
        assert!(!text.contains("tok_live_0123456789abcdef") && !text.contains(TOOL_KEY), "{text}");
    }
    assert_eq!(
        failed["attempts"][0]["error"], "HTTP 400: upstream refused Authorization: Bearer [redacted] (key [redacted])",
        "{failed}"
    );
    for secret in ["tok_live_0123456789abcdef", TOOL_KEY] {
        let stored = redis_values_containing(&fleet, secret).await;
        assert!(stored.is_empty(), "Redis values hold {secret}: {stored:?}");
    }
}

/// `KEY` is in none of the API answers given, the session's stream (its tokens joined too), any
/// Redis value of the fleet or the fleet's log; a failure lists every place that holds it.
async fn assert_kept_nowhere(fleet: &Fleet, answers: &[Value], frames: &[(String, String, String, Value)]) {
    let mut places: Vec<String> = answers
        .iter()
        .filter(|answer| answer.to_string().contains(KEY))
        .map(|answer| format!("API answer {answer}"))
        .collect();
    let streamed: String = frames.iter().map(|f| f.3["token"].as_str().unwrap_or(&f.0)).collect();
    if streamed.contains(KEY) {
        places.push(format!("session stream: {:?}", frames.iter().map(|f| &f.2).collect::<Vec<_>>()));
    }
    places.extend(redis_values_containing(fleet, KEY).await.into_iter().map(|key| format!("Redis {key}")));
    let logged = fleet.logs().lines().filter(|l| l.contains(KEY)).count();
    if logged > 0 {
        places.push(format!("{logged} log lines"));
    }
    assert!(places.is_empty(), "the key is kept in {} places: {places:#?}", places.len());
}
