//! What a turn may say about its assistant and model: the seed's assistant object (name, title,
//! description) is accepted and runs, a silent `model_config` gets the fleet's default model and
//! the seed's temperature, `model_config.provider` picks one of two configured providers (two mock
//! models, each with its own key), an unknown provider is a 422 naming the field, a provider
//! failing retryably falls back to the next, and every streamed event carries `session_id` and
//! `created_at`.

use std::time::Duration;

use serde_json::{json, Value};

use fleet_protocol::timefmt::millis_from_rfc3339;
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::{post_turn, read_until_done};
use fleet_tests::{spawn_fleet, Fleet, FleetOptions};

/// A fleet whose default provider (`openai`) is `a` and whose provider `b` falls back to it.
async fn two_provider_fleet(a: &MockLlm, b: &MockLlm) -> Fleet {
    let providers = json!({"b": {"base_url": b.base_url(), "api_key_env": "FLEET_TEST_B_KEY", "fallback": "openai"}});
    spawn_fleet(
        FleetOptions::default()
            .env("FLEET_LLM_BASE_URL", &a.base_url())
            .env("FLEET_LLM_API_KEY", "sk-provider-a")
            .env("FLEET_LLM_PROVIDERS", &providers.to_string())
            .env("FLEET_TEST_B_KEY", "sk-provider-b")
            .env("FLEET_LLM_DEFAULT_MODEL", "house-model")
            .env("FLEET_RETRY_DELAYS", "0.2,0.4,0.8"),
    )
    .await
}

/// The turn's state as stored in Redis (raw JSON).
async fn stored_turn(fleet: &Fleet, execution_id: &str) -> String {
    let keys = fleet_protocol::keys::Keys::new(fleet.key_prefix.clone());
    let client = redis::Client::open(fleet_tests::redis_url()).unwrap();
    let mut conn = fleet_tests::redis_connection(&client).await;
    redis::AsyncCommands::get(&mut conn, keys.turn(execution_id)).await.unwrap()
}

fn body(session: &str, assistant: Value) -> Value {
    json!({"session_id": session, "assistant": assistant, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_shaped_assistant_runs_with_the_fleets_defaults_and_events_carry_base_fields() {
    let a = MockLlm::start(|_, _| LlmReply::text("hello from a")).await;
    let b = MockLlm::start(|_, _| LlmReply::text("hello from b")).await;
    let fleet = two_provider_fleet(&a, &b).await;
    let seed_assistant = json!({
        "name": "support_assistant",
        "title": "Support Assistant",
        "description": "Helps users with support questions",
        "created_at": "2026-01-20T12:00:00Z",
        "instructions": "You are a helpful support assistant.",
        "enabled_tools": []
    });
    let before = fleet_platform::now_ms();
    let id = post_turn(&fleet, &body("s_seed", seed_assistant)).await;
    // From the session's first event: the turn may be over before the stream opens.
    let frames = read_until_done(&fleet, "s_seed", Some("0-0")).await;
    let after = fleet_platform::now_ms();

    let kinds: Vec<&str> = frames.iter().map(|(_, _, e, _)| e.as_str()).collect();
    assert_eq!(kinds.last(), Some(&"done"), "{kinds:?}");
    assert!(kinds.contains(&"token") && kinds.contains(&"message_complete"), "{kinds:?}");
    for (_, _, kind, data) in &frames {
        assert_eq!(data["session_id"], "s_seed", "{kind}: {data}");
        assert!(data["message_id"].as_str().is_some_and(|m| m.starts_with("msg_")), "{kind}: {data}");
        let at = data["created_at"].as_str().and_then(millis_from_rfc3339);
        assert!(at.is_some_and(|at| (before..=after).contains(&at)), "{kind}: created_at within the turn: {data}");
    }

    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(15)).await;
    assert_eq!(done["assistant_id"], "support_assistant", "the seed's name stands for the id");
    let config = &done["turn"]["model_config"];
    assert_eq!(
        (&config["provider"], &config["model"], &config["temperature"]),
        (&json!("openai"), &json!("house-model"), &json!(0.7)),
        "the stored turn says which provider, model and temperature ran: {done}"
    );
    let sent = a.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].body["model"], "house-model", "FLEET_LLM_DEFAULT_MODEL");
    assert_eq!(sent[0].body["temperature"], 0.7, "the seed's default temperature");
    assert_eq!(sent[0].authorization.as_deref(), Some("Bearer sk-provider-a"));
    assert!(b.requests().is_empty(), "the default provider only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_provider_is_called_with_its_own_key_and_an_unknown_one_is_refused() {
    let a = MockLlm::start(|_, _| LlmReply::text("from a")).await;
    let b = MockLlm::start(|_, _| LlmReply::text("from b")).await;
    let fleet = two_provider_fleet(&a, &b).await;

    let unknown = json!({"id": "asst_1", "model_config": {"provider": "c", "model": "m"}});
    let (status, resp) = fleet.post("/v1/turns", &body("s_unknown", unknown)).await;
    assert_eq!(status, 422, "{resp}");
    let message = resp["error"]["message"].as_str().unwrap();
    assert!(message.contains("assistant.model_config.provider"), "{message}");
    let stray = json!({"id": "asst_1", "colour": "red"});
    let (status, resp) = fleet.post("/v1/turns", &body("s_unknown", stray)).await;
    assert_eq!(status, 422, "a field the seed does not define is refused: {resp}");
    assert!(resp["error"]["message"].as_str().unwrap().contains("colour"), "{resp}");

    let named = json!({"id": "asst_1", "model_config": {"provider": "b", "model": "model-b", "temperature": 0.1}});
    let id = post_turn(&fleet, &body("s_b", named)).await;
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(15)).await;
    assert_eq!(done["turn"]["final_message"]["content"], "from b");
    let sent = b.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!((&sent[0].body["model"], &sent[0].body["temperature"]), (&json!("model-b"), &json!(0.1)));
    assert_eq!(sent[0].authorization.as_deref(), Some("Bearer sk-provider-b"), "b's key, from FLEET_TEST_B_KEY");
    assert!(a.requests().is_empty(), "the request reached b, not a");
    let stored = stored_turn(&fleet, &id).await;
    assert!(stored.contains(r#""provider":"b""#), "{stored}");
    assert!(!stored.contains("sk-provider-b"), "no provider key is stored with the turn: {stored}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_failing_retryably_falls_back_within_the_attempt() {
    let a = MockLlm::start(|_, _| LlmReply::text("rescued by a")).await;
    let b = MockLlm::start(|_, _| LlmReply::Status(503)).await;
    let fleet = two_provider_fleet(&a, &b).await;
    let assistant = json!({"id": "asst_1", "model_config": {"provider": "b", "model": "m"}});
    let id = post_turn(&fleet, &body("s_fallback", assistant)).await;
    let frames = read_until_done(&fleet, "s_fallback", Some("0-0")).await;
    let kinds: Vec<&str> = frames.iter().map(|(_, _, e, _)| e.as_str()).collect();
    assert!(!kinds.contains(&"retry"), "the fallback answers within the same attempt: {kinds:?}");
    let done = fleet.wait_status(&id, "succeeded", Duration::from_secs(15)).await;
    assert_eq!(done["turn"]["final_message"]["content"], "rescued by a");
    assert_eq!((b.requests().len(), a.requests().len()), (1, 1));
    assert_eq!(a.requests()[0].authorization.as_deref(), Some("Bearer sk-provider-a"));
}
