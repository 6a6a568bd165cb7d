//! Agent-turn helpers shared by the turn tests: a turn body, posting it, sending a seed 001 agent
//! an input without waiting for its turn, reading a session's SSE stream until `done` or its raw
//! events from Redis, and a fleet wired to a mock model.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use crate::llm::MockLlm;
use crate::{Fleet, FleetOptions};

/// A turn request for `session` with one user message and the given enabled tools.
pub fn turn_body(session: &str, text: &str, tools: &[&str]) -> Value {
    json!({
        "session_id": session,
        "assistant": {"id": "asst_1", "instructions": "You are helpful.", "model_config": {"provider": "openai", "model": "test-model", "temperature": 0.2}, "enabled_tools": tools},
        "messages": [{"role": "user", "content": text}]
    })
}

pub async fn post_turn(fleet: &Fleet, body: &Value) -> String {
    let (status, resp) = fleet.post("/v1/turns", body).await;
    assert_eq!(status, 202, "{resp}");
    assert_eq!(resp["data"]["status"], "queued");
    resp["data"]["execution_id"].as_str().unwrap().to_string()
}

/// Reads SSE frames from a session's stream until one is `done`: (raw frame, id, event, data).
pub async fn read_until_done(
    fleet: &Fleet,
    session: &str,
    last_event_id: Option<&str>,
) -> Vec<(String, String, String, Value)> {
    let mut req = fleet.http.get(format!("{}/v1/sessions/{session}/stream", fleet.api)).bearer_auth(&fleet.token);
    if let Some(id) = last_event_id {
        req = req.header("Last-Event-ID", id);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut bytes = resp.bytes_stream();
    let mut buf = String::new();
    let mut frames = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let chunk =
            tokio::time::timeout_at(deadline, bytes.next()).await.expect("stream ended in time").unwrap().unwrap();
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            if frame.starts_with(':') {
                continue;
            }
            let lines: Vec<&str> = frame.trim_end().lines().collect();
            assert_eq!(lines.len(), 3, "id, event and data lines: {frame:?}");
            let id = lines[0].strip_prefix("id: ").expect("id line").to_string();
            let event = lines[1].strip_prefix("event: ").expect("event line").to_string();
            let data: Value = serde_json::from_str(lines[2].strip_prefix("data: ").expect("data line")).unwrap();
            assert_eq!(data["type"], event.as_str(), "event name and type agree");
            let done = event == "done";
            frames.push((frame, id, event, data));
            if done {
                return frames;
            }
        }
    }
}

pub fn llm_fleet(llm: &MockLlm) -> FleetOptions {
    FleetOptions::default()
        .env("FLEET_LLM_BASE_URL", &llm.base_url())
        .env("FLEET_LLM_API_KEY", "sk-test-key")
        .env("FLEET_RETRY_DELAYS", "0.2,0.4,0.8,1.6,3.2")
}

/// Sends seed 001's agent `agent` an input on `session` and takes the 201 at once (the turn runs
/// on): the turn's id, read from its input event (appended before the 201).
pub async fn send_agent_input(fleet: &Fleet, agent: &str, session: &str, text: &str) -> String {
    let body = json!({"type": "input", "behavior": "follow_up", "messages": [{"type": "text", "content": text}]});
    let resp = fleet
        .http
        .post(format!("{}/v2/agents/{agent}/sessions/{session}/events", fleet.api))
        .bearer_auth(&fleet.token)
        .header("Request-Timeout-Millis", "50")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201, "{}", resp.text().await.unwrap_or_default());
    let events = session_events(fleet, session).await;
    let asked = |e: &&Value| e["type"] == "input_message" && e["messages"][0]["content"] == text;
    let input = events.iter().rev().find(asked).expect("the input's event");
    input["execution_id"].as_str().unwrap().to_string()
}

/// The events of a session's stream as the workers and the dispatcher appended them (read from
/// Redis, for an unbound caller's session).
pub async fn session_events(fleet: &Fleet, session: &str) -> Vec<Value> {
    let key = fleet_protocol::keys::Keys::new(fleet.key_prefix.clone()).session(session, "events");
    let events: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg(key).arg("-").arg("+").query_async(&mut fleet.redis().await).await.unwrap();
    events
        .iter()
        .filter_map(|(_, fields)| fields.iter().find(|(k, _)| k == "data"))
        .filter_map(|(_, data)| serde_json::from_str::<Value>(data).ok())
        .collect()
}
