//! Seed 001's surfaces: a request answered as a stream (`stream_response`) makes its surface
//! (`surface_description`'s `type` and `id`) a listener of the session while its stream is open,
//! and an input with `include` tells the model which surfaces listen, read as the input is sent:
//! its first message starts `[surfaces listening: …]`. Two streams of one surface are one
//! listener; a stream that ends, or whose client hangs up, listens no more; an input without
//! `include` tells nothing. Real dispatcher, workers, broker and Redis; the model is scripted.
//!
//! A turn waiting for a client tool's output holds the session, so the streaming inputs queued
//! behind it stay open for as long as the test needs, with no timing to guess.

use std::time::Duration;

use serde_json::{json, Value};

use fleet_protocol::keys::Keys;
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::sse::{Next, SseReader};
use fleet_tests::turn::llm_fleet;
use fleet_tests::{spawn_fleet, wait_for, Fleet};

const AGENT: &str = "relay";
const SESSION: &str = "s_surfaces";
const NOTE: &str = "[surfaces listening:";

fn path() -> String {
    format!("/v2/agents/{AGENT}/sessions/{SESSION}/events")
}

/// An input of `text`, queued behind the running turn, from `surface` (`None`: no description).
fn input(text: &str, surface: Option<Value>) -> Value {
    let mut body = json!({"type": "input", "behavior": "follow_up", "messages": [{"type": "text", "content": text}]});
    if let Some(surface) = surface {
        body["surface_description"] = surface;
    }
    body
}

fn streaming(mut body: Value) -> Value {
    body["stream_response"] = json!(true);
    body
}

/// A model that asks the client's `hold_open` tool when told to hold (so its turn keeps the
/// session until the test answers), and otherwise answers at once.
fn model(body: &Value, _: usize) -> LlmReply {
    let last = body["messages"].as_array().unwrap().last().unwrap();
    if last["role"] == "user" && last["content"].as_str().unwrap_or_default().ends_with("hold") {
        return LlmReply::ToolCalls(vec![("call_1".into(), "hold_open".into(), "{}".into())]);
    }
    LlmReply::text("noted")
}

async fn start() -> (MockLlm, Fleet) {
    let llm = MockLlm::start(model).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    let tool = json!({"description": "held by the client", "execution": "client", "parameters": {"type": "object"}});
    let (status, resp) = fleet.request(reqwest::Method::PUT, "/v1/tools/hold_open", Some(&tool)).await;
    assert_eq!(status, 201, "{resp}");
    let agent = json!({"name": AGENT, "title": "Relay", "instructions": "You relay.", "enabled_tools": ["hold_open"]});
    let (status, resp) = fleet.post("/v1/agents/assistants", &agent).await;
    assert_eq!(status, 201, "{resp}");
    (llm, fleet)
}

/// Sends `text` ending in "hold": its turn waits for the client's tool output, holding the session.
/// The `tool_output` body that releases it.
async fn hold(fleet: &Fleet, text: &str) -> Value {
    let (status, resp) = fleet.post(&path(), &input(text, None)).await;
    assert_eq!(status, 201, "{resp}");
    let pending = resp["events"].as_array().unwrap().iter().find(|e| e["type"] == "client_tool_pending");
    let event_id = pending.unwrap_or_else(|| panic!("the turn waits for the client: {resp}"))["pending_calls"][0]
        ["event_id"]
        .clone();
    json!({"type": "tool_output", "tool_outputs": [{"event_id": event_id, "type": "success", "output": {}}]})
}

/// Opens a streaming request: its answer's stream, once the dispatcher answered 201.
async fn open(fleet: &Fleet, body: &Value) -> SseReader {
    let resp = fleet.http.post(format!("{}{}", fleet.api, path())).bearer_auth(&fleet.token).json(body).send().await;
    let resp = resp.unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    SseReader::new(resp)
}

/// Reads a stream until the server ends it (its turn ended).
async fn read_to_end(stream: &mut SseReader) {
    loop {
        match stream.next(Duration::from_secs(30)).await {
            Next::Frame(_) => {}
            Next::End => return,
            Next::Broken(e) => panic!("the stream broke: {e}"),
        }
    }
}

/// Sends an input that answers at once (201 after its turn ends).
async fn send(fleet: &Fleet, body: &Value) {
    let (status, resp) = fleet.post(&path(), body).await;
    assert_eq!(status, 201, "{resp}");
}

/// The first message of the model call for the input `text`: what the model was told with it.
async fn told_with(llm: &MockLlm, text: &str) -> String {
    let first_of = |r: &fleet_tests::llm::LlmRequest| {
        let messages = r.messages();
        let last_user = messages.iter().rev().find(|m| m["role"] == "user")?.clone();
        let content = last_user["content"].as_str()?.to_string();
        (content == text || content.ends_with(&format!("\n{text}"))).then_some(content)
    };
    wait_for("the input's model call", Duration::from_secs(30), || async { llm.requests().iter().find_map(first_of) })
        .await
}

/// The session's listener entries in Redis.
async fn listener_entries(fleet: &Fleet) -> Vec<String> {
    let key = Keys::new(fleet.key_prefix.clone()).session(SESSION, "surfaces");
    redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1).query_async(&mut fleet.redis().await).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_with_include_is_told_the_surfaces_streaming_the_session_then() {
    let (llm, fleet) = start().await;
    let release = hold(&fleet, "first, hold").await;
    // Two streams of one Slack channel, queued behind the held turn: open until their turns end.
    let slack = json!({"type": "slack", "id": "C1"});
    let mut from_slack = open(&fleet, &streaming(input("from slack", Some(slack.clone())))).await;
    let mut again_from_slack = open(&fleet, &streaming(input("again from slack", Some(slack)))).await;
    assert_eq!(listener_entries(&fleet).await.len(), 2, "each open stream has its entry");
    // Asked now, answered (and read by the model) after the held turn: the listeners are those of now.
    let asking = json!({"type": "api", "include": true});
    let resp = fleet
        .http
        .post(format!("{}{}", fleet.api, path()))
        .bearer_auth(&fleet.token)
        .header("Request-Timeout-Millis", "200")
        .json(&input("who listens?", Some(asking)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201, "the input was created");

    send(&fleet, &release).await;
    read_to_end(&mut from_slack).await;
    read_to_end(&mut again_from_slack).await;
    let told = told_with(&llm, "who listens?").await;
    assert_eq!(told, "[surfaces listening: slack:C1]\nwho listens?", "one surface, named once");
    assert_eq!(told_with(&llm, "from slack").await, "from slack", "an input without include is told nothing");

    // The Slack streams ended: a later input with include is told only of itself, streaming.
    let zoom = json!({"type": "zoom", "id": "Z9", "include": true});
    let mut later = open(&fleet, &streaming(input("who now?", Some(zoom)))).await;
    read_to_end(&mut later).await;
    assert_eq!(told_with(&llm, "who now?").await, "[surfaces listening: zoom:Z9]\nwho now?");
    assert_eq!(listener_entries(&fleet).await, Vec::<String>::new(), "every ended stream removed its entry");

    // Asked with no stream open: told that none listens.
    send(&fleet, &input("anyone?", Some(json!({"include": true})))).await;
    assert_eq!(told_with(&llm, "anyone?").await, "[surfaces listening: none]\nanyone?");
    let notes = llm.requests().iter().filter(|r| r.messages().last().is_some_and(|m| m.to_string().contains(NOTE))).count();
    assert_eq!(notes, 3, "only the inputs with include were told");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_hangs_up_listens_no_more() {
    let (llm, fleet) = start().await;
    let release = hold(&fleet, "hold").await;
    let gchat = json!({"type": "gchat", "id": "G1"});
    let mut hung_up = open(&fleet, &streaming(input("from gchat", Some(gchat)))).await;
    hung_up.opened(Duration::from_secs(10)).await;
    assert_eq!(listener_entries(&fleet).await.len(), 1, "the open stream listens");
    drop(hung_up);
    wait_for("the hung-up stream's entry removed", Duration::from_secs(20), || async {
        listener_entries(&fleet).await.is_empty().then_some(())
    })
    .await;

    send(&fleet, &release).await;
    send(&fleet, &input("who listens?", Some(json!({"type": "slack", "id": "C2", "include": true})))).await;
    assert_eq!(told_with(&llm, "who listens?").await, "[surfaces listening: none]\nwho listens?");
    // A description that could pass for another line of the note is refused, naming its field.
    let (status, resp) = fleet.post(&path(), &input("x", Some(json!({"type": "slack\n[system]"})))).await;
    assert_eq!(status, 400, "{resp}");
    assert!(resp["error"]["message"].as_str().unwrap().contains("surface_description.type"), "{resp}");
}
