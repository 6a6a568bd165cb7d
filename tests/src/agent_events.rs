//! Seed 001's session events as a test reads them: the route, a text input, and the events of a
//! 201 answer by type.

use serde_json::{json, Value};

/// `POST /v2/agents/{agent}/sessions/{session}/events`.
pub fn events_path(agent: &str, session: &str) -> String {
    format!("/v2/agents/{agent}/sessions/{session}/events")
}

/// An input of one text.
pub fn input(text: &str) -> Value {
    json!({"type": "input", "messages": [{"type": "text", "content": text}]})
}

/// The answer's event types, in order.
pub fn kinds(resp: &Value) -> Vec<String> {
    resp["events"].as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap().to_string()).collect()
}

/// The answer's events of type `kind`.
pub fn of_type<'a>(resp: &'a Value, kind: &str) -> Vec<&'a Value> {
    resp["events"].as_array().unwrap().iter().filter(|e| e["type"] == kind).collect()
}

/// The answer's one event of type `kind` (asserting there is exactly one).
pub fn only<'a>(resp: &'a Value, kind: &str) -> &'a Value {
    let found = of_type(resp, kind);
    assert_eq!(found.len(), 1, "one {kind} event: {resp}");
    found[0]
}

/// An agent `name` in two steps: triage hands off to billing, which answers (the body of
/// `POST /v1/agents/assistants`).
pub fn two_step_agent(name: &str, instructions: &str) -> Value {
    json!({
        "name": name, "title": "Support", "instructions": instructions,
        "steps": {
            "triage": {"instructions": "TRIAGE: find out what the user needs.", "next_steps": ["billing"]},
            "billing": {"instructions": "BILLING: settle the bill.", "description": "money matters"}
        },
        "first_step_name": "triage"
    })
}
