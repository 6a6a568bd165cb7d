//! Seed 001's session events as plain data: the events only seed 001 has (the input, a client
//! tool's pending calls, a compaction), and the view that turns a session's stream (the seed 000
//! events the workers append) into seed 001's events, each with `id`, `session_key`, `created_at`
//! and `type`. One stream serves both seeds; this view decides what a seed 001 client sees.

use serde_json::{json, Map, Value};

/// Seed 001's event ids: the stream entry's id behind a prefix (`aev_1733312345678-0`), so an id
/// is also a cursor into the stream.
const EVENT_ID_PREFIX: &str = "aev_";

/// The seed 001 id of the stream entry `stream_id`.
pub fn event_id(stream_id: &str) -> String {
    format!("{EVENT_ID_PREFIX}{stream_id}")
}

/// The stream entry an event id names, if it is one of ours (`<ms>-<seq>` after the prefix).
pub fn stream_id_of(event_id: &str) -> Option<&str> {
    let id = event_id.strip_prefix(EVENT_ID_PREFIX)?;
    let (ms, seq) = id.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    (digits(ms) && digits(seq)).then_some(id)
}

/// The turn (`exec_…`) whose model call streamed under `message_id` (`msg_<hex>`, or
/// `msg_<hex>_<n>` for its later calls; see `turn::model_call_message_id`).
pub fn turn_of_message(message_id: &str) -> Option<String> {
    let rest = message_id.strip_prefix("msg_")?;
    let hex = rest.split('_').next()?;
    (!hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| format!("exec_{hex}"))
}

/// The turn an internal event belongs to: named by an input, else by its message id.
pub fn turn_of(event: &Value) -> Option<String> {
    if let Some(id) = event["execution_id"].as_str() {
        return Some(id.to_string());
    }
    turn_of_message(event["message_id"].as_str()?)
}

/// Whether the event ends what a seed 001 response waits for: its turn finished (`done`), or it
/// waits for the client's tool outputs (`client_tool_pending`).
pub fn is_terminal(event: &Value) -> bool {
    matches!(event["type"].as_str(), Some("done" | "client_tool_pending"))
}

/// One input of a seed 001 message, as its event shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum InputPart {
    Text(String),
    /// A skill by name, and the content it loads.
    Skill(String, String),
}

impl InputPart {
    fn shown(&self) -> Value {
        match self {
            InputPart::Text(content) => json!({"type": "text", "content": content}),
            InputPart::Skill(name, _) => json!({"type": "skill", "skill_name": name}),
        }
    }

    /// What the model reads for it: the text, or the skill's content under its name.
    pub fn for_model(&self) -> String {
        match self {
            InputPart::Text(content) => content.clone(),
            InputPart::Skill(name, content) => format!("[skill {name}]\n{content}"),
        }
    }
}

/// The events a seed 001 input makes, appended before its turn is published: its input event,
/// then one skill-load event per skill it invokes.
pub fn input_events(execution_id: &str, parts: &[InputPart], surface: Option<&Value>) -> Vec<Value> {
    let mut events = vec![input_message_event(execution_id, parts, surface)];
    for part in parts {
        if let InputPart::Skill(name, content) = part {
            events.push(
                json!({"type": "skill_load", "skill_name": name, "content": content, "execution_id": execution_id}),
            );
        }
    }
    events
}

fn input_message_event(execution_id: &str, parts: &[InputPart], surface: Option<&Value>) -> Value {
    let messages: Vec<Value> = parts.iter().map(InputPart::shown).collect();
    let mut event = json!({"type": "input_message", "messages": messages, "execution_id": execution_id});
    if let Some(surface) = surface {
        event["surface_description"] = surface.clone();
    }
    event
}

/// Which turn's call a client tool's event names: what a `tool_output` answering it records.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClientCall {
    pub turn: String,
    /// The call's key in its turn (`turn::call_key`).
    pub key: String,
    /// The round whose model answer made the call.
    pub round: u32,
    /// The model's id for the call.
    pub call_id: String,
    pub tool_name: String,
    /// The agent's tool configuration the model called, and what its overrides gave the call as
    /// events show it (secrets `****`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown_overrides: Option<Value>,
}

/// One call a turn waits on the client for.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingClientCall {
    /// The seed 001 id of the call's `tool_input` event.
    pub event_id: String,
    pub tool_name: String,
    /// The tool configuration the model called, if it called one.
    pub configuration: Option<String>,
    /// The model's arguments with the configuration's overrides laid over (its secrets sealed).
    pub arguments: Value,
}

/// The owner a client call's sealed secrets are sealed for: its session, so a sealed value copied
/// into another session's event does not open.
pub fn client_call_owner(session_id: &str) -> String {
    format!("client-call/{session_id}")
}

/// The turn waits for the client's `tool_output` for each of `calls`.
pub fn client_tool_pending_event(calls: &[PendingClientCall], message_id: &str) -> Value {
    let pending: Vec<Value> = calls
        .iter()
        .map(|c| {
            json!({"event_id": c.event_id, "tool_configuration_name": c.configuration.as_ref().unwrap_or(&c.tool_name),
                "tool_name": c.tool_name, "arguments": c.arguments})
        })
        .collect();
    json!({"type": "client_tool_pending", "pending_calls": pending, "message_id": message_id})
}

/// What a compaction did, as its event reports it.
pub fn compaction_event(report: &crate::compaction::Report, message_id: &str) -> Value {
    json!({
        "type": "compaction",
        "turns_compacted": report.turns_compacted,
        "events_compacted": report.events_compacted,
        "summary_text": report.summary_text,
        "summary_key": report.summary_key,
        "message_id": message_id,
    })
}

/// An internal event (`stream_id`, its JSON as the stream holds it) as seed 001 shows it, or
/// `None` for what seed 001 has no event for (tokens, retries, `done`, an empty answer).
pub fn to_v2(stream_id: &str, event: &Value) -> Option<Value> {
    let (kind, mut fields) = match event["type"].as_str()? {
        "input_message" => ("input_message", input_fields(event)),
        "tool_call" => ("tool_input", tool_input_fields(&event["tool_call"])),
        "tool_result" => ("tool_output", tool_output_fields(&event["tool_call"])),
        "error" if event["error"]["tool_call_id"].is_string() => ("tool_output", tool_error_fields(&event["error"])),
        "error" if event["error"]["code"] == crate::turn::CONTEXT_LIMIT_EXCEEDED => {
            ("context_limit_exceeded", context_limit_fields(&event["error"]))
        }
        "error" => ("error", error_fields(&event["error"])),
        "message_complete" => {
            let content = event["message"]["content"].as_str().filter(|c| !c.is_empty())?;
            ("agent_output", object(json!({"content": content})))
        }
        "reasoning" => {
            let content = event["content"].as_str().filter(|c| !c.is_empty())?;
            ("reasoning", object(json!({"content": content})))
        }
        "client_tool_pending" => ("client_tool_pending", object(json!({"pending_calls": event["pending_calls"]}))),
        "compaction" => ("compaction", compaction_fields(event)),
        "skill_load" => ("skill_load", copied(event, &["skill_name", "content"])),
        "step_transition" => ("step_transition", copied(event, &["from_step", "to_step", "content"])),
        "structured_output" => ("structured_output", copied(event, &["schema_name", "content"])),
        "transition_limit_exceeded" => ("transition_limit_exceeded", copied(event, &["transition_limit", "message"])),
        "artifact_upload" => ("artifact_upload", copied(event, &["artifacts", "agent_upload_message"])),
        "image_load" => ("image_load", copied(event, &["artifact_id", "detail"])),
        _ => return None,
    };
    fields.insert("id".into(), json!(event_id(stream_id)));
    fields.insert("session_key".into(), event["session_id"].clone());
    fields.insert("created_at".into(), event["created_at"].clone());
    fields.insert("type".into(), json!(kind));
    Some(Value::Object(fields))
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn input_fields(event: &Value) -> Map<String, Value> {
    let mut fields = object(json!({"messages": event["messages"]}));
    if let Some(surface) = event.get("surface_description") {
        fields.insert("surface_description".into(), surface.clone());
    }
    fields
}

/// The configuration a tool event's call used: named on the event, else the tool itself.
fn configuration_of(inner: &Value, tool: &Value) -> Value {
    inner.get("tool_configuration_name").cloned().unwrap_or_else(|| tool.clone())
}

fn tool_input_fields(call: &Value) -> Map<String, Value> {
    let input = if call["parameters"].is_object() { call["parameters"].clone() } else { json!({}) };
    let mut fields = object(
        json!({"tool_call_id": call["id"], "tool_configuration_name": configuration_of(call, &call["tool_name"]),
        "tool_name": call["tool_name"], "tool_input": input}),
    );
    if let Some(paths) = call.get("argument_override_paths") {
        fields.insert("argument_override_paths".into(), paths.clone());
    }
    fields
}

/// A result that is not a JSON object is wrapped as `{"content": …}` (`output_wrapped`), so the
/// event's `tool_output` is always an object, as seed 001 has it.
fn tool_output_fields(call: &Value) -> Map<String, Value> {
    let result = &call["result"];
    let (output, wrapped) =
        if result.is_object() { (result.clone(), false) } else { (json!({"content": result}), true) };
    let mut fields = object(
        json!({"tool_call_id": call["id"], "tool_configuration_name": configuration_of(call, &call["tool_name"]),
        "tool_name": call["tool_name"], "tool_output": output, "output_wrapped": wrapped, "error": false}),
    );
    if let Some(resolved) = call.get("resolved_argument_overrides") {
        fields.insert("resolved_argument_overrides".into(), resolved.clone());
    }
    fields
}

fn tool_error_fields(error: &Value) -> Map<String, Value> {
    let tool = error["tool_name"].as_str().unwrap_or_default();
    object(
        json!({"tool_call_id": error["tool_call_id"], "tool_configuration_name": configuration_of(error, &json!(tool)), "tool_name": tool,
        "tool_output": {"error": error["message"], "code": error["code"]}, "error": true}),
    )
}

fn error_fields(error: &Value) -> Map<String, Value> {
    let message = error["message"].as_str().unwrap_or("the turn failed");
    object(json!({"messages": [message], "code": error["code"]}))
}

/// Seed 001's `context_limit_exceeded`: the window, the prompt's estimate, and what to do.
fn context_limit_fields(error: &Value) -> Map<String, Value> {
    object(json!({"context_limit": error["context_limit"], "actual_tokens": error["actual_tokens"],
        "message": error["message"]}))
}

fn compaction_fields(event: &Value) -> Map<String, Value> {
    copied(event, &["turns_compacted", "events_compacted", "summary_text", "summary_key"])
}

fn copied(event: &Value, keys: &[&str]) -> Map<String, Value> {
    keys.iter().map(|k| (k.to_string(), event[*k].clone())).collect()
}

/// Names the tool configuration a tool event's call used (seed 001), with one more field of it
/// (`argument_override_paths` on a call, `resolved_argument_overrides` on a result).
pub fn name_configuration(event: &mut Value, configuration: &str, field: &str, value: Value) {
    let inner = if event.get("tool_call").is_some() { "tool_call" } else { "error" };
    if let Some(inner) = event.get_mut(inner).and_then(Value::as_object_mut) {
        inner.insert("tool_configuration_name".into(), json!(configuration));
        inner.insert(field.into(), value);
    }
}

/// The agent moved from one step to another; `content` is the handoff message.
pub fn step_transition_event(from: &str, to: &str, content: &str, message_id: &str) -> Value {
    json!({"type": "step_transition", "from_step": from, "to_step": to, "content": content, "message_id": message_id})
}

/// The answer, checked against its output schema.
pub fn structured_output_event(schema_name: &str, content: &Value, message_id: &str) -> Value {
    json!({"type": "structured_output", "schema_name": schema_name, "content": content, "message_id": message_id})
}

/// The turn asked for more step transitions than its agent allows, and ended.
pub fn transition_limit_event(limit: u32, message_id: &str) -> Value {
    let message = format!(
        "the agent made more than {limit} step transitions in one turn (its transition_limit); the turn ended. \
         Send a new input to go on, or raise the agent's transition_limit"
    );
    json!({"type": "transition_limit_exceeded", "transition_limit": limit, "message": message, "message_id": message_id})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn;

    fn stamped(event: Value) -> Value {
        turn::with_base_fields(event, "s1", 1_768_910_400_000)
    }

    #[test]
    fn event_ids_are_stream_cursors() {
        assert_eq!(event_id("17-0"), "aev_17-0");
        assert_eq!(stream_id_of("aev_17-0"), Some("17-0"));
        for bad in ["17-0", "aev_", "aev_x-0", "aev_17", "aev_17-", "aev_-1"] {
            assert_eq!(stream_id_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_message_id_names_its_turn() {
        assert_eq!(turn_of_message("msg_0aF9"), Some("exec_0aF9".into()));
        assert_eq!(turn_of_message("msg_0af9_3"), Some("exec_0af9".into()));
        assert_eq!(turn_of_message("msg_"), None);
        assert_eq!(turn_of_message("nope"), None);
        let input = input_message_event("exec_ab", &[InputPart::Text("hi".into())], None);
        assert_eq!(turn_of(&input), Some("exec_ab".into()));
        assert_eq!(turn_of(&turn::done_event("msg_ab_2")), Some("exec_ab".into()));
    }

    #[test]
    fn every_v2_event_has_the_base_fields() {
        let events = [
            input_message_event("exec_ab", &[InputPart::Text("hi".into())], Some(&json!({"type": "slack"}))),
            turn::tool_call_event(
                &turn::ToolCall { id: "c1".into(), name: "t".into(), arguments: "{}".into() },
                &json!({"q": 1}),
                "msg_ab",
            ),
            turn::tool_result_event(
                "c1",
                "t",
                &turn::CallOutcome { ok: true, result: json!("text"), external: None },
                "msg_ab",
            ),
            turn::error_event("tool_callback_failed", "HTTP 500", Some(("c1", "t")), "msg_ab"),
            turn::error_event("llm_error", "bad", None, "msg_ab"),
            turn::reasoning_event("Thinking.", "msg_ab"),
            turn::message_complete_event(&json!({"id": "msg_ab", "content": "Hello"})),
            client_tool_pending_event(
                &[PendingClientCall {
                    event_id: "aev_1-0".into(),
                    tool_name: "t".into(),
                    configuration: None,
                    arguments: json!({}),
                }],
                "msg_ab",
            ),
        ];
        let kinds: Vec<String> = events
            .iter()
            .map(|e| {
                let v2 = to_v2("5-1", &stamped(e.clone())).expect("a v2 event");
                assert_eq!(v2["id"], "aev_5-1");
                assert_eq!(v2["session_key"], "s1");
                assert_eq!(v2["created_at"], "2026-01-20T12:00:00.000Z");
                v2["type"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "input_message",
                "tool_input",
                "tool_output",
                "tool_output",
                "error",
                "reasoning",
                "agent_output",
                "client_tool_pending"
            ]
        );
    }

    #[test]
    fn tool_outputs_are_objects_and_errors_say_so() {
        let text = turn::tool_result_event(
            "c1",
            "t",
            &turn::CallOutcome { ok: true, result: json!("sunny"), external: None },
            "m",
        );
        let v2 = to_v2("1-0", &stamped(text)).unwrap();
        assert_eq!(
            (v2["tool_output"].clone(), v2["output_wrapped"].clone(), v2["error"].clone()),
            (json!({"content": "sunny"}), json!(true), json!(false))
        );
        let obj = turn::tool_result_event(
            "c1",
            "t",
            &turn::CallOutcome { ok: true, result: json!({"t": 20}), external: None },
            "m",
        );
        assert_eq!(to_v2("1-0", &stamped(obj)).unwrap()["tool_output"], json!({"t": 20}));
        let failed = turn::error_event("tool_callback_failed", "HTTP 500", Some(("c1", "weather")), "m");
        let v2 = to_v2("1-0", &stamped(failed)).unwrap();
        assert_eq!((v2["error"].clone(), v2["tool_name"].clone()), (json!(true), json!("weather")));
        assert_eq!(v2["tool_output"]["error"], "HTTP 500");
    }

    #[test]
    fn a_context_overflow_is_seed_001s_context_limit_exceeded() {
        let over = turn::ContextOverflow { context_limit: 50, actual_tokens: 260 };
        let v2 = to_v2("3-0", &stamped(over.error_event("msg_ab"))).unwrap();
        assert_eq!(v2["type"], "context_limit_exceeded");
        assert_eq!((v2["context_limit"].as_u64(), v2["actual_tokens"].as_u64()), (Some(50), Some(260)));
        assert_eq!(v2["message"], over.message());
        assert_eq!((v2["id"].as_str(), v2["session_key"].as_str()), (Some("aev_3-0"), Some("s1")));
        assert!(!is_terminal(&v2), "the turn's `done` ends the answer");
    }

    #[test]
    fn uploads_and_image_loads_are_seed_001s_events() {
        let file = crate::artifacts::Artifact {
            artifact_id: "art_1".into(),
            filename: "a.png".into(),
            mime_type: "image/png".into(),
            size_bytes: 9,
            created_at: "t".into(),
            tenant: Some("acme".into()),
        };
        let upload = crate::artifacts::upload_event(std::slice::from_ref(&file), "The user uploaded a.png");
        let v2 = to_v2("4-0", &stamped(upload)).unwrap();
        assert_eq!(v2["type"], "artifact_upload");
        assert_eq!(
            v2["artifacts"],
            json!([{"artifact_id": "art_1", "filename": "a.png", "mime_type": "image/png", "size_bytes": 9}])
        );
        assert_eq!(
            (v2["agent_upload_message"].as_str(), v2["id"].as_str()),
            (Some("The user uploaded a.png"), Some("aev_4-0"))
        );
        let load = crate::artifacts::image_load_event("art_1", crate::chat::ImageDetail::High, "msg_ab");
        let v2 = to_v2("5-0", &stamped(load)).unwrap();
        let mut keys: Vec<&str> = v2.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["artifact_id", "created_at", "detail", "id", "session_key", "type"]);
        assert_eq!((v2["type"].as_str(), v2["detail"].as_str()), (Some("image_load"), Some("high")));
    }

    #[test]
    fn reasoning_is_shown_with_its_content_alone() {
        let v2 = to_v2("2-0", &stamped(turn::reasoning_event("Let me think.", "msg_ab"))).unwrap();
        let mut keys: Vec<&str> = v2.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["content", "created_at", "id", "session_key", "type"]);
        assert_eq!((v2["type"].as_str(), v2["content"].as_str()), (Some("reasoning"), Some("Let me think.")));
    }

    #[test]
    fn tokens_retries_done_and_empty_answers_have_no_v2_event() {
        for e in [
            turn::token_event("x", 0, "m"),
            turn::retry_event("m", 1, "llm_retry", "e"),
            turn::done_event("m"),
            turn::message_complete_event(&json!({"id": "m", "content": ""})),
            turn::reasoning_event("", "m"),
        ] {
            assert_eq!(to_v2("1-0", &stamped(e.clone())), None, "{e}");
        }
        assert!(is_terminal(&turn::done_event("m")));
        assert!(!is_terminal(&turn::token_event("x", 0, "m")));
    }
}
