//! A turn's persisted state between its steps: its conversation, the tool calls it waits for
//! (keyed by round and place), their outcomes as the model reads them, steers, and the message id
//! of each model call.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::input::{Assistant, Behavior, TurnInput};
use crate::fair::Priority;

fn is_normal(p: &Priority) -> bool {
    *p == Priority::Normal
}

/// Model rounds a turn may take before it is stopped (configurable per fleet).
pub const DEFAULT_MAX_ROUNDS: u32 = 8;

pub use crate::chat::{Message, ToolCall};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingCall {
    /// The model's id for the call: what the model is answered with, never a key (models reuse ids
    /// across rounds, and some give none).
    pub call_id: String,
    pub tool_name: String,
    pub execution_id: Option<String>,
    /// Where the turn keeps the call's outcome (`call_key`); empty in a state saved before calls
    /// were keyed by position (the model's id stood for it).
    #[serde(default)]
    pub key: String,
    /// A client-executed tool's call: the seed 001 id of its `tool_input` event, which the
    /// client's `tool_output` names. None for a call the fleet runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_event: Option<String>,
    /// The agent's tool configuration the model called by name (seed 001), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<String>,
    /// The call waits for an operator's decision, under this policy (`approvals::needs_approval`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<crate::approval_policy::ApprovalPolicy>,
}

impl PendingCall {
    /// A call of a built-in tool (`call` as the model made it), answered at once under `key`.
    pub fn answered(call: &ToolCall, key: String) -> Self {
        PendingCall {
            call_id: call.id.clone(),
            tool_name: call.name.clone(),
            execution_id: None,
            key,
            client_event: None,
            configuration: None,
            approval: None,
        }
    }

    /// The key of the call's outcome.
    pub fn outcome_key(&self) -> &str {
        if self.key.is_empty() {
            &self.call_id
        } else {
            &self.key
        }
    }
}

/// The key of call `position` of round `round`'s answer: unique within the turn whatever ids the
/// model gave.
pub fn call_key(round: u32, position: u32) -> String {
    format!("r{round}.{position}")
}

/// How a tool call ended, as the model will read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallOutcome {
    pub ok: bool,
    pub result: Value,
    /// Seed 002's structured result, when the call ended with one: the model reads its observation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<crate::external_result::ExternalResult>,
}

impl CallOutcome {
    /// A call that ended with seed 002's structured result: a success's result is its
    /// structured content (else its content); anything else is a failure whose result is it whole.
    pub fn structured(external: crate::external_result::ExternalResult) -> Self {
        let ok = external.is_success();
        let result = if ok {
            external.structured_content.clone().or_else(|| external.content.clone()).unwrap_or(Value::Null)
        } else {
            serde_json::to_value(&external).unwrap_or(Value::Null)
        };
        CallOutcome { ok, result, external: Some(external) }
    }

    /// Whether the tool itself answered (a success, or its own structured failure), as opposed to
    /// a call the fleet gave up on or cancelled: those are told as `error` events.
    pub fn answered(&self) -> bool {
        self.ok
            || (self.external.is_some()
                && self.result.get("dead_lettered").is_none()
                && self.result.get("cancelled").is_none()
                && !crate::approval_policy::is_refusal(&self.result))
    }
}

/// A turn's persisted state between its steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnState {
    pub session_id: String,
    pub assistant: Assistant,
    pub behavior: Behavior,
    pub conversation: Vec<Message>,
    /// The model call the next step makes (0-based).
    pub round: u32,
    /// Tool calls of the previous round still owed a result.
    #[serde(default)]
    pub pending: Vec<PendingCall>,
    /// Every tool call of the turn, for the execution view.
    #[serde(default)]
    pub tool_calls: Vec<PendingCall>,
    #[serde(default)]
    pub final_message: Option<Value>,
    /// The message id of the turn's latest model call (`model_call_message_id`).
    pub message_id: String,
    /// Tokens the provider reported across the turn's model calls.
    #[serde(default)]
    pub usage: Usage,
    /// Whose turn it is (`tenant::resolve`); `None` for a turn stored before tenants existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The turn's priority within its tenant (`fair::Priority`).
    #[serde(default, skip_serializing_if = "is_normal")]
    pub priority: Priority,
    /// Messages of the session's history placed in `conversation` after the instructions.
    #[serde(default)]
    pub history_len: usize,
    /// Whether the session's history was read into the conversation (round 0, once).
    #[serde(default)]
    pub history_read: bool,
    /// How many of the turn's own messages were already appended to the session's history.
    #[serde(default)]
    pub remembered: usize,
    /// The turn ended as a dead letter: its steps do nothing until a replay reopens it.
    #[serde(default)]
    pub dead_lettered: bool,
    /// Model calls begun so far: each streams under its own message id.
    #[serde(default)]
    pub model_calls: u32,
    /// A model call that began streaming and whose answer was never saved: the next call of the
    /// same attempt (its step run again after its worker was lost) announces it abandoned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streaming: Option<StreamingCall>,
    /// The turns whose steers joined the conversation (each joins once).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steers_taken: Vec<String>,
    /// Of those, the ones not yet told (their execution succeeds, `steered_into` this turn).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steers_unanswered: Vec<String>,
    /// A compaction of the session's history (seed 001) rather than an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<crate::compaction::Compaction>,
    /// A seed 001 agent's turn: its parts as they were when the input was sent, and its step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Box<crate::agent_config::AgentTurn>>,
    /// Images the last round's `load_image` calls loaded: shown to the model in a user message
    /// after the round's tool results (`show_images`), as references (never the bytes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images_due: Vec<crate::chat::ImageRef>,
}

/// A model call that began: its message id and the attempt it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamingCall {
    pub message_id: String,
    pub attempt: u32,
}

/// The message id of a turn's model call number `n` (0-based): the turn's own id (`msg_…`) for
/// its first, a derived one for every later call, so no two calls (a retry, a step run again after
/// its worker died, the next round) ever stream under one id.
pub fn model_call_message_id(turn_id: &str, n: u32) -> String {
    let base = format!("msg_{}", turn_id.strip_prefix("exec_").unwrap_or(turn_id));
    if n == 0 {
        base
    } else {
        format!("{base}_{n}")
    }
}

/// A steer waiting in its session for the running turn's next model call: which turn sent it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Steer {
    pub from: String,
    pub message: Message,
}

impl Steer {
    /// Reads a steer entry (older entries were a bare message).
    pub fn parse(raw: &str) -> Option<Steer> {
        serde_json::from_str(raw)
            .ok()
            .or_else(|| serde_json::from_str(raw).ok().map(|message| Steer { from: String::new(), message }))
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl TurnState {
    pub fn new(input: &TurnInput, message_id: String) -> Self {
        let mut conversation = Vec::new();
        if !input.assistant.instructions.is_empty() {
            conversation.push(Message::text("system", &input.assistant.instructions));
        }
        conversation.extend(input.messages.iter().map(|m| Message::text(&m.role, &m.content)));
        TurnState {
            session_id: input.session_id.clone(),
            assistant: input.assistant.clone(),
            behavior: input.behavior,
            conversation,
            round: 0,
            pending: vec![],
            tool_calls: vec![],
            final_message: None,
            message_id,
            usage: Usage::default(),
            tenant: input.tenant.clone(),
            priority: input.priority,
            history_len: 0,
            history_read: false,
            remembered: 0,
            dead_lettered: false,
            model_calls: 0,
            streaming: None,
            steers_taken: vec![],
            steers_unanswered: vec![],
            compaction: None,
            agent: input.agent.clone(),
            images_due: vec![],
        }
    }

    /// Puts the images due into the conversation: one user message (tool results cannot carry
    /// images) whose text notes each image, so the history it joins keeps the note alone.
    pub fn show_images(&mut self) {
        if self.images_due.is_empty() {
            return;
        }
        let images = std::mem::take(&mut self.images_due);
        let notes: Vec<String> = images.iter().map(|i| format!("[image {} loaded]", i.artifact_id)).collect();
        let mut message = Message::text("user", &notes.join("\n"));
        message.images = images;
        self.conversation.push(message);
    }

    /// The step the turn is in (seed 001), once known.
    pub fn step(&self) -> Option<&str> {
        self.agent.as_ref().filter(|a| a.step_known).and_then(|a| a.step.as_deref())
    }

    /// The system prompt for the turn's step (the agent's instructions, the step's, its
    /// handoffs), put in place of the first message.
    pub fn tell_step(&mut self) {
        let Some(agent) = &self.agent else { return };
        if self.assistant.instructions.is_empty() {
            return;
        }
        let prompt = agent.config.system_prompt(&self.assistant.instructions, agent.step.as_deref());
        if let Some(first) = self.conversation.first_mut().filter(|m| m.role == "system") {
            first.content = Some(prompt);
        }
    }

    /// Puts the session's history between the instructions and the turn's own messages (once).
    pub fn insert_history(&mut self, history: Vec<Message>) {
        if self.history_read || self.history_len > 0 {
            return;
        }
        self.history_read = true;
        let at = usize::from(!self.assistant.instructions.is_empty()).min(self.conversation.len());
        self.history_len = history.len();
        self.conversation.splice(at..at, history);
    }

    /// The turn's own messages not yet appended to the history, with the index of the first
    /// among the turn's own messages.
    pub fn unremembered(&self) -> (usize, &[Message]) {
        let own = usize::from(!self.assistant.instructions.is_empty()) + self.history_len;
        let start = (own + self.remembered).min(self.conversation.len());
        (self.remembered, &self.conversation[start..])
    }

    /// Whether the assistant may call `tool`.
    pub fn enabled(&self, tool: &str) -> bool {
        self.assistant.enabled_tools.iter().any(|t| t == tool)
    }
}

/// Parses a tool call's arguments; arguments that are not a JSON object are an error for the model.
pub fn parse_arguments(arguments: &str) -> Result<Value, String> {
    let text = if arguments.trim().is_empty() { "{}" } else { arguments };
    match serde_json::from_str::<Value>(text) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err("tool arguments must be a JSON object".into()),
        Err(e) => Err(format!("tool arguments are not valid JSON: {e}")),
    }
}

/// What the model reads for a tool call's outcome: the result's JSON text (an error wrapped as
/// `{"error": …}`, unless it is an object with a string `error` already, like `tool_unavailable`'s), or, above `max_bytes`, `{"truncated": true, "bytes": <full size>, "content":
/// <its first bytes, cut at a UTF-8 boundary>}`. The execution record keeps the whole result.
pub fn tool_message_content(outcome: &CallOutcome, max_bytes: usize) -> String {
    if let Some(external) = &outcome.external {
        return external.clone().bounded(max_bytes).observation_text();
    }
    let already_an_error = outcome.result.get("error").is_some_and(Value::is_string);
    let full = if outcome.ok || already_an_error {
        outcome.result.to_string()
    } else {
        json!({"error": outcome.result}).to_string()
    };
    if full.len() <= max_bytes {
        return full;
    }
    let mut cut = max_bytes;
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    json!({"truncated": true, "bytes": full.len(), "content": &full[..cut]}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_calls_key_is_its_round_and_place_whatever_the_models_id() {
        assert_eq!(call_key(0, 0), "r0.0");
        assert_ne!(call_key(0, 1), call_key(1, 0));
        let legacy = PendingCall {
            call_id: "call_0".into(),
            tool_name: "t".into(),
            execution_id: None,
            key: String::new(),
            client_event: None,
            configuration: None,
            approval: None,
        };
        assert_eq!(legacy.outcome_key(), "call_0");
        let keyed = PendingCall { key: call_key(1, 0), ..legacy };
        assert_eq!(keyed.outcome_key(), "r1.0");
    }

    #[test]
    fn steers_name_their_turn_and_old_entries_still_read() {
        let steer = Steer { from: "exec_b".into(), message: Message::text("user", "also") };
        assert_eq!(Steer::parse(&serde_json::to_string(&steer).unwrap()), Some(steer));
        let old = Steer::parse(r#"{"role":"user","content":"hi"}"#).unwrap();
        assert_eq!((old.from.as_str(), old.message.content.as_deref()), ("", Some("hi")));
    }

    #[test]
    fn history_goes_between_the_instructions_and_the_new_messages() {
        let input: TurnInput = serde_json::from_value(json!({"session_id": "s", "assistant": {"id": "a", "instructions": "be brief", "model_config": {"model": "m"}}, "messages": [{"role": "user", "content": "new"}]})).unwrap();
        let mut state = TurnState::new(&input, "msg_1".into());
        state.insert_history(vec![Message::text("user", "old"), Message::text("assistant", "old answer")]);
        state.insert_history(vec![Message::text("user", "twice")]);
        let contents: Vec<_> = state.conversation.iter().map(|m| m.content.clone().unwrap()).collect();
        assert_eq!(contents, ["be brief", "old", "old answer", "new"]);
        state.conversation.push(Message::text("assistant", "answer"));
        let (first, own) = state.unremembered();
        assert_eq!((first, own.len()), (0, 2));
        state.remembered = 2;
        state.conversation.push(Message::text("user", "steered"));
        let (first, own) = state.unremembered();
        assert_eq!((first, own[0].content.as_deref()), (2, Some("steered")));
    }

    #[test]
    fn loaded_images_follow_the_tool_results_as_one_user_message() {
        let input: TurnInput = serde_json::from_value(json!({"session_id": "s", "assistant": {"id": "a", "instructions": "", "model_config": {"model": "m"}}, "messages": [{"role": "user", "content": "look"}]})).unwrap();
        let mut state = TurnState::new(&input, "msg_1".into());
        state.show_images();
        assert_eq!(state.conversation.len(), 1, "nothing due, nothing shown");
        let image = |id: &str| crate::chat::ImageRef {
            artifact_id: id.into(),
            mime_type: "image/png".into(),
            detail: crate::chat::ImageDetail::Auto,
        };
        state.images_due = vec![image("art_1"), image("art_2")];
        state.show_images();
        let shown = state.conversation.last().unwrap();
        assert_eq!((shown.role.as_str(), shown.images.len()), ("user", 2));
        assert_eq!(shown.content.as_deref(), Some("[image art_1 loaded]\n[image art_2 loaded]"));
        assert!(state.images_due.is_empty());
        let history = crate::history::exchange_entries("exec_1", 0, &state.conversation[1..], "msg_1", "t");
        assert!(history[0].to_message().images.is_empty(), "the history keeps the note, not the image");
    }

    #[test]
    fn each_model_call_has_its_own_message_id() {
        assert_eq!(model_call_message_id("exec_abc", 0), "msg_abc");
        assert_eq!(model_call_message_id("exec_abc", 1), "msg_abc_1");
        assert_ne!(model_call_message_id("exec_abc", 2), model_call_message_id("exec_abc", 1));
    }

    #[test]
    fn arguments_must_be_objects() {
        assert_eq!(parse_arguments("").unwrap(), json!({}));
        assert!(parse_arguments("[1]").is_err());
        assert!(parse_arguments("{bad").is_err());
    }

    #[test]
    fn large_tool_results_are_cut_at_a_char_boundary_for_the_model() {
        let small = CallOutcome { ok: true, result: json!({"n": 1}), external: None };
        assert_eq!(tool_message_content(&small, 100), r#"{"n":1}"#);
        let failed = CallOutcome { ok: false, result: json!("HTTP 404"), external: None };
        assert_eq!(tool_message_content(&failed, 100), r#"{"error":"HTTP 404"}"#);
        let flat = CallOutcome { ok: false, result: json!({"error": "tool_unavailable", "tool": "t"}), external: None };
        assert_eq!(tool_message_content(&flat, 100), r#"{"error":"tool_unavailable","tool":"t"}"#);
        let big = CallOutcome { ok: true, result: json!("é".repeat(100)), external: None };
        let seen: Value = serde_json::from_str(&tool_message_content(&big, 10)).unwrap();
        assert_eq!(seen["truncated"], true);
        assert_eq!(seen["bytes"], 202);
        // 10 bytes would split an 'é' (the text starts with a quote): cut at 9.
        assert_eq!(seen["content"], format!("\"{}", "é".repeat(4)));
    }
}
