//! The seed's streaming events (its Streaming Contract) as JSON, and their SSE wire format.

use serde_json::{json, Value};

use super::state::{CallOutcome, ToolCall};

/// Adds the base fields every event of a session carries (seed 001): the session (its key as the
/// client sent it, without a tenant's scope) and when the event was made (RFC 3339, UTC).
pub fn with_base_fields(mut event: Value, session_id: &str, created_at_ms: i64) -> Value {
    if let Some(fields) = event.as_object_mut() {
        fields.insert("session_id".into(), json!(crate::tenant::session_key_shown(session_id)));
        fields.insert("created_at".into(), json!(crate::timefmt::rfc3339_from_millis(created_at_ms)));
    }
    event
}

pub fn token_event(token: &str, index: u64, message_id: &str) -> Value {
    json!({"type": "token", "token": token, "index": index, "message_id": message_id})
}

pub fn message_complete_event(message: &Value) -> Value {
    json!({"type": "message_complete", "message": message, "message_id": message["id"]})
}

/// What a reasoning model thought before its answer or tool calls (one event per model call, once
/// the call ended): shown to the client, never kept in the conversation.
pub fn reasoning_event(content: &str, message_id: &str) -> Value {
    json!({"type": "reasoning", "content": content, "message_id": message_id})
}

pub fn tool_call_event(call: &ToolCall, parameters: &Value, message_id: &str) -> Value {
    json!({"type": "tool_call", "tool_call": {"id": call.id, "tool_name": call.name, "parameters": parameters, "status": "pending"}, "message_id": message_id})
}

/// A call's result; one that ended with seed 002's structured result also carries it whole
/// (`external_result`), whatever its status.
pub fn tool_result_event(call_id: &str, tool_name: &str, outcome: &CallOutcome, message_id: &str) -> Value {
    let status = if outcome.ok { "completed" } else { "failed" };
    let mut event = json!({"type": "tool_result", "tool_call": {"id": call_id, "tool_name": tool_name, "status": status, "result": outcome.result}, "message_id": message_id});
    if let Some(external) = &outcome.external {
        event["tool_call"]["external_result"] = json!(external);
    }
    event
}

/// A turn's error; `call` (the call's id and tool) when it is a tool call's.
pub fn error_event(code: &str, message: &str, call: Option<(&str, &str)>, message_id: &str) -> Value {
    let mut error = json!({"code": code, "message": crate::sanitize::sanitize_error(message)});
    if let Some((id, tool)) = call {
        error["tool_call_id"] = json!(id);
        error["tool_name"] = json!(tool);
    }
    json!({"type": "error", "error": error, "message_id": message_id})
}

/// An abandoned model call: the client drops the tokens it received under `message_id`; the next
/// call streams under a new message id. `code` says why (`llm_retry`: the model failed and is asked
/// again; `model_call_abandoned`: the worker running it was lost).
pub fn retry_event(message_id: &str, attempt: u32, code: &str, error: &str) -> Value {
    let message = crate::sanitize::sanitize_error(error);
    json!({"type": "retry", "message_id": message_id, "attempt": attempt, "error": {"code": code, "message": message}})
}

pub fn done_event(message_id: &str) -> Value {
    json!({"type": "done", "message_id": message_id})
}

/// One SSE frame in the seed's wire format, with an `id:` line for `Last-Event-ID` resume.
pub fn sse_frame(id: &str, event: &Value) -> String {
    let kind = event["type"].as_str().unwrap_or("message");
    format!("id: {id}\nevent: {kind}\ndata: {event}\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_retry_event_is_sanitised() {
        let e = retry_event("msg_a", 2, "llm_retry", "see https://u:p@h/x?k=1\n at f (/a.js:1:1)");
        let text = e.to_string();
        assert!(!text.contains("u:p@") && !text.contains("k=1") && !text.contains("/a.js"), "{text}");
    }

    #[test]
    fn sse_frames_follow_the_seed() {
        let frame = sse_frame("7-0", &token_event("Hello", 0, "msg_123"));
        assert_eq!(frame, "id: 7-0\nevent: token\ndata: {\"index\":0,\"message_id\":\"msg_123\",\"token\":\"Hello\",\"type\":\"token\"}\n\n");
        assert_eq!(done_event("m")["type"], "done");
    }

    #[test]
    fn events_carry_the_seeds_base_fields() {
        let event = with_base_fields(token_event("Hi", 0, "msg_1"), "s1", 1_768_910_400_000);
        assert_eq!(event["session_id"], "s1");
        assert_eq!(event["created_at"], "2026-01-20T12:00:00.000Z");
        assert_eq!((event["type"].as_str(), event["message_id"].as_str()), (Some("token"), Some("msg_1")));
        let complete = message_complete_event(&json!({"id": "msg_1", "content": "Hi"}));
        assert_eq!(complete["message_id"], "msg_1");
    }

    #[test]
    fn error_events_carry_sanitised_messages() {
        let e = error_event("x", "failed at https://u:p@h.example/a?k=v\n\tat Foo.bar(Foo.java:1)", None, "m");
        assert_eq!(e["error"]["message"], "failed at https://h.example/a");
    }
}
