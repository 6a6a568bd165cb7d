//! Seed 001's request body, as parsed and checked (pure): an input, client tool outputs, or a
//! compaction. A problem is a 400 naming the field, as the seed has it for a malformed request.

use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use fleet_protocol::agent_config::AgentConfig;
use fleet_protocol::agent_session::{stream_id_of, InputPart};
use fleet_protocol::surfaces::{self, Surface};

/// One seed 001 event: `input_message` (`messages`), `tool_input` (`tool_call_id`, `tool_name`,
/// `tool_configuration_name`, `tool_input`), `tool_output` (the same with `tool_output`,
/// `output_wrapped`, `error`), `agent_output` (`content`), `client_tool_pending` (`pending_calls`:
/// `event_id`, `tool_name`, `tool_configuration_name`, `arguments`), `compaction`
/// (`turns_compacted`, `events_compacted`, `summary_text`, `summary_key`), `error` (`messages`).
// The schema of what the session's stream stores and the answer passes on as JSON: the fields
// every event has (the stream is read back as `Value`, so this type is never built).
#[allow(dead_code)]
#[derive(ToSchema)]
pub(crate) struct AgentEvent {
    /// `aev_…`: also a `since` cursor.
    id: String,
    session_key: String,
    /// RFC 3339.
    created_at: String,
    #[schema(rename = "type")]
    kind: String,
}

/// The body of `POST /v2/agents/{agent_key}/sessions/{session_key}/events`.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum SessionInput {
    /// New input for the agent: a turn of the session.
    #[serde(alias = "input_message")]
    Input(InputRequest),
    /// The outputs of client tool calls the session waits for (`client_tool_pending`).
    ToolOutput(ToolOutputRequest),
    /// Summarise the older history with the session's model.
    Compaction(CompactionRequest),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum InputBehavior {
    /// Join the running turn at its next model call.
    Steer,
    /// Run after the current turn, in arrival order.
    FollowUp,
}

/// Who submits the request (kept on an input's event). The `(type, id)` pair is the surface: a
/// request answered as a stream makes it a listener of the session while the stream is open, and
/// repeat submissions from one pair are one surface.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SurfaceDescription {
    /// The kind of surface (`slack`, `gchat`, `zoom`, or any label of at most 128 bytes without
    /// control characters); `api` when omitted.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// The surface within its kind, e.g. a connector's id (at most 128 bytes).
    #[serde(default)]
    pub id: Option<String>,
    /// On an input: tell the model which surfaces are streaming this session now (this input's own,
    /// if it streams, included), so it knows where its answer will be seen.
    #[serde(default)]
    pub include: Option<bool>,
}

impl SurfaceDescription {
    /// Its labels, checked: they may be shown to the model.
    pub(crate) fn check(&self) -> Result<(), String> {
        surfaces::check_label("type", self.kind.as_deref())?;
        surfaces::check_label("id", self.id.as_deref())
    }

    pub(crate) fn surface(&self) -> Surface {
        Surface::described(self.kind.as_deref(), self.id.as_deref())
    }

    pub(crate) fn include(&self) -> bool {
        self.include == Some(true)
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct InputRequest {
    /// The request's kind: the body's `type` (read by `SessionInput`; named here so the schema
    /// allows it beside this variant's fields).
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    pub messages: Vec<AgentInput>,
    /// Answer as SSE, event by event, instead of one 201 body.
    #[serde(default)]
    pub stream_response: bool,
    #[serde(default)]
    pub surface_description: Option<SurfaceDescription>,
    /// An event id (`aev_…`) or `start`: the answer includes every event after it.
    #[serde(default)]
    pub since: Option<String>,
    #[serde(default)]
    pub behavior: Option<InputBehavior>,
    /// The step the agent enters before this input: a key of the agent's `steps`. Absent: the
    /// session's current step (a new session's: the agent's `first_step_name`).
    #[serde(default)]
    pub entry_step: Option<String>,
}

/// One input of a message.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum AgentInput {
    Text {
        content: String,
    },
    /// Loads the agent's skill of that name into the conversation.
    Skill {
        skill_name: String,
    },
}

#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolOutputRequest {
    /// The request's kind: the body's `type` (read by `SessionInput`; named here so the schema
    /// allows it beside this variant's fields).
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    pub tool_outputs: Vec<ToolOutput>,
    #[serde(default)]
    pub stream_response: bool,
    #[serde(default)]
    pub surface_description: Option<SurfaceDescription>,
}

/// The result of one client tool call, named by its `tool_input` event.
#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum ToolOutput {
    Success {
        event_id: String,
        #[schema(value_type = Object)]
        output: Map<String, Value>,
    },
    Error {
        event_id: String,
        #[schema(value_type = Object)]
        error: Value,
    },
}

impl ToolOutput {
    pub(crate) fn event_id(&self) -> &str {
        match self {
            ToolOutput::Success { event_id, .. } | ToolOutput::Error { event_id, .. } => event_id,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompactionRequest {
    /// The request's kind: the body's `type` (read by `SessionInput`; named here so the schema
    /// allows it beside this variant's fields).
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub stream_response: bool,
    #[serde(default)]
    pub surface_description: Option<SurfaceDescription>,
    /// Compact through this event's turn, inclusive; else all but the most recent exchange.
    #[serde(default)]
    pub compact_up_to_event_id: Option<String>,
    /// The prompt the summarising model call uses instead of the fleet's.
    #[serde(default)]
    pub compaction_message: Option<String>,
}

/// Where a `since` starts: the session's first event, or after an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Since {
    Start,
    After(String),
}

/// Texts at most this long.
const MAX_TEXT_BYTES: usize = 256 * 1024;
/// Inputs or tool outputs in one request.
const MAX_ITEMS: usize = 100;

impl InputRequest {
    /// The inputs to send, each skill's content loaded from `agent`, checked; the error names
    /// the field.
    pub(crate) fn parts(&self, agent: &AgentConfig) -> Result<Vec<InputPart>, String> {
        if let Some(step) = &self.entry_step {
            if !agent.steps.contains_key(step) {
                let known: Vec<&str> = agent.steps.keys().map(String::as_str).collect();
                return Err(format!(
                    "entry_step {step:?} is not a step of this agent (its steps: [{}])",
                    known.join(", ")
                ));
            }
        }
        if self.messages.is_empty() || self.messages.len() > MAX_ITEMS {
            return Err(format!("messages must hold 1 to {MAX_ITEMS} inputs"));
        }
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| match m {
                AgentInput::Text { content } if content.is_empty() => Err(format!("messages[{i}].content is empty")),
                AgentInput::Text { content } if content.len() > MAX_TEXT_BYTES => {
                    Err(format!("messages[{i}].content is longer than 256 KiB"))
                }
                AgentInput::Text { content } => Ok(InputPart::Text(content.clone())),
                AgentInput::Skill { skill_name } => match agent.skills.get(skill_name) {
                    Some(skill) => Ok(InputPart::Skill(skill_name.clone(), skill.content.clone())),
                    None => Err(format!("messages[{i}].skill_name {skill_name:?} is not a skill of this agent")),
                },
            })
            .collect()
    }

    pub(crate) fn since(&self) -> Result<Option<Since>, String> {
        parse_since(self.since.as_deref())
    }
}

fn parse_since(since: Option<&str>) -> Result<Option<Since>, String> {
    match since {
        None => Ok(None),
        Some("start") => Ok(Some(Since::Start)),
        Some(id) if stream_id_of(id).is_some() => Ok(Some(Since::After(id.to_string()))),
        Some(other) => Err(format!("since {other:?} is neither \"start\" nor an event id (aev_…) of this session")),
    }
}

impl ToolOutputRequest {
    /// The outputs, checked: at least one, each event named once, each in our id form.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.tool_outputs.is_empty() || self.tool_outputs.len() > MAX_ITEMS {
            return Err(format!("tool_outputs must hold 1 to {MAX_ITEMS} outputs"));
        }
        for (i, output) in self.tool_outputs.iter().enumerate() {
            let id = output.event_id();
            if stream_id_of(id).is_none() {
                return Err(format!("tool_outputs[{i}].event_id {id:?} is not an event id (aev_…)"));
            }
            if self.tool_outputs[..i].iter().any(|o| o.event_id() == id) {
                return Err(format!("tool_outputs[{i}].event_id {id:?} is answered twice in this request"));
            }
        }
        Ok(())
    }
}

impl CompactionRequest {
    pub(crate) fn check(&self) -> Result<(), String> {
        if let Some(id) = &self.compact_up_to_event_id {
            if stream_id_of(id).is_none() {
                return Err(format!("compact_up_to_event_id {id:?} is not an event id (aev_…)"));
            }
        }
        if self.compaction_message.as_ref().is_some_and(|m| m.is_empty() || m.len() > 64 * 1024) {
            return Err("compaction_message must be 1 byte to 64 KiB".into());
        }
        Ok(())
    }
}

impl SessionInput {
    pub(crate) fn surface(&self) -> Option<&SurfaceDescription> {
        match self {
            SessionInput::Input(r) => r.surface_description.as_ref(),
            SessionInput::ToolOutput(r) => r.surface_description.as_ref(),
            SessionInput::Compaction(r) => r.surface_description.as_ref(),
        }
    }

    pub(crate) fn stream_response(&self) -> bool {
        match self {
            SessionInput::Input(r) => r.stream_response,
            SessionInput::ToolOutput(r) => r.stream_response,
            SessionInput::Compaction(r) => r.stream_response,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<SessionInput, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn the_seeds_three_bodies_parse() {
        let input = parse(json!({"type": "input", "messages": [{"type": "text", "content": "hi"}], "behavior": "steer", "since": "start"})).unwrap();
        let SessionInput::Input(input) = input else { panic!("an input") };
        assert_eq!(input.parts(&AgentConfig::default()).unwrap(), [InputPart::Text("hi".into())]);
        assert_eq!((input.behavior, input.since().unwrap()), (Some(InputBehavior::Steer), Some(Since::Start)));
        let outputs = parse(json!({"type": "tool_output", "tool_outputs": [
            {"event_id": "aev_1-0", "type": "success", "output": {"t": 1}},
            {"event_id": "aev_2-0", "type": "error", "error": "denied"}]}))
        .unwrap();
        let SessionInput::ToolOutput(outputs) = outputs else { panic!("tool outputs") };
        assert_eq!(outputs.check(), Ok(()));
        let compaction = parse(json!({"type": "compaction", "compact_up_to_event_id": "aev_3-1"})).unwrap();
        let SessionInput::Compaction(c) = compaction else { panic!("a compaction") };
        assert_eq!(c.check(), Ok(()));
        assert!(parse(json!({"type": "input_message", "messages": []})).is_ok(), "the event's own name is an alias");
    }

    #[test]
    fn the_tag_is_read_by_the_enum_and_allowed_beside_each_variants_fields() {
        let SessionInput::Input(input) = parse(json!({"type": "input", "messages": []})).unwrap() else { panic!() };
        assert_eq!(input.kind, None, "the tag is the enum's");
    }

    #[test]
    fn problems_name_their_field() {
        assert!(parse(json!({"type": "chat"})).unwrap_err().contains("unknown variant `chat`"));
        assert!(parse(json!({"type": "input", "messages": [], "colour": 1})).unwrap_err().contains("colour"));
        let output_without_object =
            json!({"type": "tool_output", "tool_outputs": [{"event_id": "aev_1-0", "type": "success", "output": "x"}]});
        assert!(parse(output_without_object).is_err(), "a success's output is an object");
        let SessionInput::Input(skill) =
            parse(json!({"type": "input", "messages": [{"type": "skill", "skill_name": "s"}]})).unwrap()
        else {
            panic!()
        };
        assert!(skill.parts(&AgentConfig::default()).unwrap_err().starts_with("messages[0].skill_name \"s\""));
        let SessionInput::Input(stepped) =
            parse(json!({"type": "input", "messages": [{"type": "text", "content": "x"}], "entry_step": "a"})).unwrap()
        else {
            panic!()
        };
        assert!(stepped.parts(&AgentConfig::default()).unwrap_err().starts_with("entry_step \"a\""));
        let SessionInput::Input(bad_since) =
            parse(json!({"type": "input", "messages": [{"type": "text", "content": "x"}], "since": "yesterday"}))
                .unwrap()
        else {
            panic!()
        };
        assert!(bad_since.since().unwrap_err().contains("yesterday"));
        let twice = json!({"type": "tool_output", "tool_outputs": [
            {"event_id": "aev_1-0", "type": "error", "error": 1}, {"event_id": "aev_1-0", "type": "error", "error": 2}]});
        let SessionInput::ToolOutput(twice) = parse(twice).unwrap() else { panic!() };
        assert!(twice.check().unwrap_err().contains("tool_outputs[1]"));
    }
}
