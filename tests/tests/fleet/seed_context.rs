//! A prompt over its model's context window through seed 001's session events: the turn ends with
//! `context_limit_exceeded` before its model call (no request made, nothing spent), its record says
//! `failed`, and the session stays usable (a shorter input and a compaction run next). The window
//! is the assistant's `model_config.context_window`, else the fleet's for the model
//! (`FLEET_LLM_CONTEXT_WINDOWS`). Real dispatcher, worker, broker and Redis; the model is scripted.

use std::time::Duration;

use serde_json::{json, Value};

use fleet_tests::agent_events::{events_path, input, kinds, only};
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::llm_fleet;
use fleet_tests::{spawn_fleet, Fleet};

/// Creates an agent whose `model_config` is `config`.
async fn create_agent(fleet: &Fleet, name: &str, config: Value) {
    let body = json!({"name": name, "title": "Support", "instructions": "You are helpful.", "model_config": config});
    let (status, resp) = fleet.post("/v1/agents/assistants", &body).await;
    assert_eq!(status, 201, "{resp}");
}

/// A model that echoes the last user message, and summarises when asked to.
fn echo(body: &Value, n: usize) -> LlmReply {
    let messages = body["messages"].as_array().unwrap();
    if messages[0]["content"].as_str().unwrap_or_default().starts_with("Summarise") {
        return LlmReply::text(&format!("SUMMARY-{n}"));
    }
    let last = messages.iter().rev().find(|m| m["role"] == "user").unwrap();
    LlmReply::text(&format!("echo: {}", last["content"].as_str().unwrap()))
}

/// About 260 tokens by the fleet's estimate (4 bytes a token).
fn long_text() -> String {
    "LONG-INPUT ".repeat(95)
}

/// Posts the long input; asserts it ended as `context_limit_exceeded` over `limit`, and that its
/// record says `failed` with that code. Answers the event.
async fn refused(fleet: &Fleet, agent: &str, session: &str, limit: u64) -> Value {
    let (status, resp) = fleet.post(&events_path(agent, session), &input(&long_text())).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(kinds(&resp), ["input_message", "context_limit_exceeded"], "{resp}");
    let event = only(&resp, "context_limit_exceeded").clone();
    assert_eq!(event["context_limit"], limit, "{event}");
    assert!(event["actual_tokens"].as_u64().unwrap() > limit, "{event}");
    let message = event["message"].as_str().unwrap();
    assert!(message.contains("compaction") && message.contains("new session"), "it says what to do: {message}");
    assert_eq!(event["session_key"], session);

    // The turn's record: failed, the error named.
    let since = only(&resp, "input_message")["id"].as_str().unwrap().strip_prefix("aev_").unwrap().to_string();
    let frames = fleet_tests::turn::read_until_done(fleet, session, Some(&since)).await;
    let error = frames.iter().find(|(_, _, kind, _)| kind == "error").expect("seed 000's error event");
    assert_eq!(error.3["error"]["code"], "context_limit_exceeded", "{}", error.3);
    let turn = fleet_protocol::agent_session::turn_of(&error.3).expect("the error names its turn");
    let record = fleet.wait_status(&turn, "failed", Duration::from_secs(10)).await;
    assert!(record.to_string().contains("context_limit_exceeded"), "{record}");
    event
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_over_its_window_ends_before_the_model_call_and_the_session_goes_on() {
    let llm = MockLlm::start(echo).await;
    // The fleet's window for the default model, which an assistant's own window overrides.
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_LLM_CONTEXT_WINDOWS", "gpt-4o=40")).await;
    create_agent(&fleet, "tight_agent", json!({"context_window": 50})).await;

    let (status, resp) = fleet.post(&events_path("tight_agent", "c1"), &input("hi")).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(kinds(&resp), ["input_message", "agent_output"], "a short input fits: {resp}");

    refused(&fleet, "tight_agent", "c1", 50).await;
    assert_eq!(llm.requests().len(), 1, "the long input made no model request");

    // The session goes on: a short input runs, its prompt without the refused input.
    let (status, resp) = fleet.post(&events_path("tight_agent", "c1"), &input("again")).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(only(&resp, "agent_output")["content"], "echo: again", "{resp}");
    let sent = llm.requests().last().unwrap().body.to_string();
    assert!(sent.contains("echo: hi") && !sent.contains("LONG-INPUT"), "{sent}");

    // And a compaction.
    let (status, resp) = fleet.post(&events_path("tight_agent", "c1"), &json!({"type": "compaction"})).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(only(&resp, "compaction")["turns_compacted"], 1, "{resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleets_window_for_the_model_applies_unless_the_assistant_names_its_own() {
    let llm = MockLlm::start(echo).await;
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_LLM_CONTEXT_WINDOWS", "gpt-4o=40,other-model=1000")).await;
    create_agent(&fleet, "fleet_window", json!({})).await;
    create_agent(&fleet, "roomy_agent", json!({"context_window": 100000})).await;

    refused(&fleet, "fleet_window", "c2", 40).await;
    assert_eq!(llm.requests().len(), 0, "no model request");

    let (status, resp) = fleet.post(&events_path("roomy_agent", "c3"), &input(&long_text())).await;
    assert_eq!(status, 201, "{resp}");
    assert_eq!(kinds(&resp), ["input_message", "agent_output"], "the assistant's window wins: {resp}");

    let bad = json!({"name": "bad_window", "title": "Bad", "instructions": "x", "model_config": {"context_window": 0}});
    let (status, resp) = fleet.post("/v1/agents/assistants", &bad).await;
    assert!((400..500).contains(&status), "{status}: {resp}");
    assert!(resp.to_string().contains("context_window"), "{resp}");
}
