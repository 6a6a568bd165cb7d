//! Agent turns as plain data and functions: the `POST /v1/turns` input, the turn's persisted state,
//! the seed's streaming events and their SSE wire format, and the assembly of an OpenAI-compatible
//! streamed response (content tokens and `delta.tool_calls` fragments) into whole messages.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Model rounds a turn may take before it is stopped (configurable per fleet).
pub const DEFAULT_MAX_ROUNDS: u32 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Behavior {
    /// Runs after the session's current turn, in arrival order.
    #[default]
    FollowUp,
    /// Joins the running turn's conversation at its next model call.
    Steer,
}

/// The temperature a turn's model call uses when its `model_config` names none (the seed's).
pub const DEFAULT_TEMPERATURE: f64 = 0.7;

/// The seed's `model_config`: every field optional. The dispatcher fills `provider`, `model` and
/// `temperature` from its settings before the turn is stored, so the turn's state says what ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    #[serde(default)]
    pub provider: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub temperature: Option<f64>,
    /// The most tokens one model call may generate (else `FLEET_LLM_MAX_TOKENS`).
    #[serde(default)]
    pub max_tokens: Option<u32>,
}

/// The seed's assistant object. Its descriptive fields (`name`, `title`, `description`,
/// `created_at`) are accepted and kept with the turn; a field the seed does not define is refused
/// (a misspelt `instructions` or `enabled_tools` would otherwise change the turn silently).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assistant {
    /// The seed's `id` (`asst_…`); when absent, the seed's `name` stands for it.
    #[serde(default)]
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(default)]
    pub instructions: String,
    #[serde(default)]
    pub model_config: ModelConfig,
    #[serde(default)]
    pub enabled_tools: Vec<String>,
}

/// One chat message as the model sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn text(role: &str, content: &str) -> Self {
        Message { role: role.into(), content: Some(content.into()), tool_calls: vec![], tool_call_id: None }
    }

    /// The OpenAI chat-completions form of this message.
    pub fn to_openai(&self) -> Value {
        let mut m = json!({"role": self.role, "content": self.content});
        if !self.tool_calls.is_empty() {
            m["tool_calls"] = self
                .tool_calls
                .iter()
                .map(
                    |c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}),
                )
                .collect();
        }
        if let Some(id) = &self.tool_call_id {
            m["tool_call_id"] = json!(id);
        }
        m
    }
}

/// A tool call the model made: arguments as the raw JSON text the model produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputMessage {
    pub role: String,
    pub content: String,
}

/// The body of `POST /v1/turns`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnInput {
    pub session_id: String,
    pub assistant: Assistant,
    pub messages: Vec<InputMessage>,
    #[serde(default)]
    pub behavior: Behavior,
}

impl TurnInput {
    /// What a silent `model_config` and a missing `id` stand for: the id is the seed's `name`,
    /// the provider and model are the fleet's defaults, the temperature is the seed's 0.7.
    pub fn apply_defaults(&mut self, default_provider: &str, default_model: &str) {
        let assistant = &mut self.assistant;
        if assistant.id.is_empty() {
            assistant.id = assistant.name.clone().unwrap_or_default();
        }
        let config = &mut assistant.model_config;
        config.provider.get_or_insert_with(|| default_provider.to_string());
        config.model.get_or_insert_with(|| default_model.to_string());
        config.temperature.get_or_insert(DEFAULT_TEMPERATURE);
    }

    /// The provider must be one the fleet is configured with (`known`), never a silent fallback.
    pub fn check_provider(&self, known: &[&str]) -> Result<(), String> {
        match self.assistant.model_config.provider.as_deref() {
            Some(p) if !known.contains(&p) => Err(format!(
                "assistant.model_config.provider {p:?} is not a configured provider (configured: {})",
                known.join(", ")
            )),
            _ => Ok(()),
        }
    }

    /// Content checks beyond the shape; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        let ident = |field: &str, v: &str| {
            if v.is_empty() || v.len() > 256 || v.chars().any(char::is_control) {
                Err(format!("{field} must be 1-256 characters without control characters"))
            } else {
                Ok(())
            }
        };
        ident("session_id", &self.session_id)?;
        if self.assistant.id.is_empty() && self.assistant.name.is_none() {
            return Err("assistant.id (or the seed's assistant.name) is required".into());
        }
        ident("assistant.id", &self.assistant.id)?;
        for (field, value) in [("assistant.name", &self.assistant.name), ("assistant.title", &self.assistant.title)] {
            if let Some(v) = value {
                ident(field, v)?;
            }
        }
        if self.assistant.description.as_ref().is_some_and(|d| d.len() > 4096) {
            return Err("assistant.description is longer than 4 KiB".into());
        }
        if self.assistant.created_at.as_deref().is_some_and(|t| crate::timefmt::millis_from_rfc3339(t).is_none()) {
            return Err("assistant.created_at must be an RFC 3339 time".into());
        }
        let config = &self.assistant.model_config;
        if let Some(provider) = &config.provider {
            ident("assistant.model_config.provider", provider)?;
        }
        if let Some(model) = &config.model {
            ident("assistant.model_config.model", model)?;
        }
        if let Some(t) = self.assistant.model_config.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err("assistant.model_config.temperature must be between 0 and 2".into());
            }
        }
        if let Some(n) = self.assistant.model_config.max_tokens {
            if !(1..=1_000_000).contains(&n) {
                return Err("assistant.model_config.max_tokens must be between 1 and 1000000".into());
            }
        }
        if self.assistant.instructions.len() > 64 * 1024 {
            return Err("assistant.instructions is longer than 64 KiB".into());
        }
        for (i, t) in self.assistant.enabled_tools.iter().enumerate() {
            if t.is_empty() || t.len() > 64 || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
                return Err(format!("assistant.enabled_tools[{i}] is not a tool name"));
            }
        }
        if self.messages.is_empty() {
            return Err("messages must hold at least one message".into());
        }
        for (i, m) in self.messages.iter().enumerate() {
            if !matches!(m.role.as_str(), "user" | "system" | "assistant") {
                return Err(format!("messages[{i}].role must be user, system or assistant"));
            }
        }
        Ok(())
    }
}

/// A tool call waiting for its callback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingCall {
    pub call_id: String,
    pub tool_name: String,
    pub execution_id: Option<String>,
}

/// How a tool call ended, as the model will read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallOutcome {
    pub ok: bool,
    pub result: Value,
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
    pub message_id: String,
    /// Tokens the provider reported across the turn's model calls.
    #[serde(default)]
    pub usage: Usage,
    /// Messages of the session's history placed in `conversation` after the instructions.
    #[serde(default)]
    pub history_len: usize,
    /// How many of the turn's own messages were already appended to the session's history.
    #[serde(default)]
    pub remembered: usize,
    /// The turn ended as a dead letter: its steps do nothing until a replay reopens it.
    #[serde(default)]
    pub dead_lettered: bool,
}

/// The claim id of a turn's step `round` (one model call): redelivered or duplicated copies of
/// the step share it, so the step runs once.
pub fn step_claim_id(turn_id: &str, round: u32) -> String {
    crate::derived_execution_id(&[turn_id, "round", &round.to_string()])
}

/// Claim tokens restart with every round's claim; the turn's record and state are fenced by
/// this number, which grows with the round first, then the token.
pub fn step_fence(round: u32, token: u64) -> u64 {
    u64::from(round) * 1_000_000 + token.min(999_999)
}

/// The fence a turn's end writes with: no step of the ended turn writes after it (a replay clears it).
pub const FINAL_FENCE: u64 = 1 << 50;

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
            history_len: 0,
            remembered: 0,
            dead_lettered: false,
        }
    }

    /// Puts the session's history between the instructions and the turn's own messages (once).
    pub fn insert_history(&mut self, history: Vec<Message>) {
        if self.history_len > 0 {
            return;
        }
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

// ---- streaming events (the seed's Streaming Contract) ----

/// Adds the base fields every event of a session carries (seed 001): the session and when the
/// event was made (RFC 3339, UTC).
pub fn with_base_fields(mut event: Value, session_id: &str, created_at_ms: i64) -> Value {
    if let Some(fields) = event.as_object_mut() {
        fields.insert("session_id".into(), json!(session_id));
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

pub fn tool_call_event(call: &ToolCall, parameters: &Value, message_id: &str) -> Value {
    json!({"type": "tool_call", "tool_call": {"id": call.id, "tool_name": call.name, "parameters": parameters, "status": "pending"}, "message_id": message_id})
}

pub fn tool_result_event(call_id: &str, tool_name: &str, outcome: &CallOutcome, message_id: &str) -> Value {
    let status = if outcome.ok { "completed" } else { "failed" };
    json!({"type": "tool_result", "tool_call": {"id": call_id, "tool_name": tool_name, "status": status, "result": outcome.result}, "message_id": message_id})
}

pub fn error_event(code: &str, message: &str, tool_call_id: Option<&str>, message_id: &str) -> Value {
    let mut error = json!({"code": code, "message": crate::sanitize::sanitize_error(message)});
    if let Some(id) = tool_call_id {
        error["tool_call_id"] = json!(id);
    }
    json!({"type": "error", "error": error, "message_id": message_id})
}

/// An abandoned model attempt: the client drops the tokens it received under `message_id`; the
/// next attempt streams under a new message id.
pub fn retry_event(message_id: &str, attempt: u32, error: &str) -> Value {
    json!({"type": "retry", "message_id": message_id, "attempt": attempt, "error": {"code": "llm_retry", "message": error}})
}

/// The message id of one model attempt: the turn's own id (`msg_…`, returned with the turn) for its
/// first call, a derived one for every later round or attempt, so no two attempts share tokens.
pub fn attempt_message_id(turn_id: &str, round: u32, attempt: u32) -> String {
    let base = format!("msg_{}", turn_id.strip_prefix("exec_").unwrap_or(turn_id));
    if round == 0 && attempt <= 1 {
        base
    } else {
        format!("{base}_r{round}a{attempt}")
    }
}

pub fn done_event(message_id: &str) -> Value {
    json!({"type": "done", "message_id": message_id})
}

/// One SSE frame in the seed's wire format, with an `id:` line for `Last-Event-ID` resume.
pub fn sse_frame(id: &str, event: &Value) -> String {
    let kind = event["type"].as_str().unwrap_or("message");
    format!("id: {id}\nevent: {kind}\ndata: {event}\n\n")
}

// ---- assembling a streamed OpenAI-compatible response ----

/// What one model call produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Completion {
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// `stop`, `tool_calls`, `length` (cut at `max_tokens`), … as the provider said.
    pub finish_reason: Option<String>,
}

/// One `chat.completion.chunk` (or a whole `chat.completion`), as far as the fleet reads it.
#[derive(Debug, Default, Deserialize)]
pub struct Chunk {
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    #[serde(default)]
    pub usage: Option<ChunkUsage>,
    /// An error reported inside a 200 stream.
    #[serde(default)]
    pub error: Option<StreamError>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ChunkChoice {
    #[serde(default)]
    pub delta: Option<Delta>,
    /// A whole (non-streamed) response's message.
    #[serde(default)]
    pub message: Option<Delta>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Delta {
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ToolCallDelta>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ToolCallDelta {
    #[serde(default)]
    pub index: Option<u64>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub function: Option<FunctionDelta>,
}

#[derive(Debug, Default, Deserialize)]
pub struct FunctionDelta {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub arguments: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ChunkUsage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamError {
    #[serde(default)]
    pub message: Option<String>,
    /// A number (an HTTP-like status) or a string code, depending on the server.
    #[serde(default)]
    pub code: Option<Value>,
}

impl StreamError {
    /// Whether the error is worth another attempt: an HTTP-like 408/429/5xx code, or no code.
    pub fn is_retryable(&self) -> bool {
        match self.code.as_ref().and_then(Value::as_u64) {
            Some(code) => code == 408 || code == 429 || code >= 500,
            None => true,
        }
    }
    pub fn describe(&self) -> String {
        let message = self.message.as_deref().unwrap_or("no message");
        match &self.code {
            Some(code) => format!("LLM stream error ({code}): {message}"),
            None => format!("LLM stream error: {message}"),
        }
    }
}

/// One SSE event's `data` from the provider, classified.
#[derive(Debug)]
pub enum StreamItem {
    Done,
    Chunk(Chunk),
    Error(StreamError),
    /// Not JSON (a comment-like payload some servers send): skipped.
    Ignored,
}

pub fn classify_stream_data(data: &str) -> StreamItem {
    if data.trim() == "[DONE]" {
        return StreamItem::Done;
    }
    match serde_json::from_str::<Chunk>(data) {
        Ok(Chunk { error: Some(error), .. }) => StreamItem::Error(error),
        Ok(chunk) => StreamItem::Chunk(chunk),
        Err(_) => StreamItem::Ignored,
    }
}

/// Accumulates `chat.completion.chunk` objects; `delta.tool_calls` fragments are joined by index.
#[derive(Debug, Default)]
pub struct CompletionBuilder {
    completion: Completion,
    calls: Vec<(u64, ToolCall)>,
}

impl CompletionBuilder {
    /// Adds one chunk; returns the content token it carried, if any.
    pub fn push(&mut self, chunk: Chunk) -> Option<String> {
        self.usage(chunk.usage.as_ref());
        let choice = chunk.choices.into_iter().next()?;
        if let Some(reason) = choice.finish_reason {
            self.completion.finish_reason = Some(reason);
        }
        let delta = choice.delta?;
        for fragment in delta.tool_calls {
            self.tool_call_fragment(fragment);
        }
        let token = delta.content.filter(|t| !t.is_empty())?;
        self.completion.content.push_str(&token);
        Some(token)
    }

    /// Adds one chunk given as JSON (chunks that do not parse carry nothing).
    pub fn push_chunk(&mut self, chunk: &Value) -> Option<String> {
        self.push(serde_json::from_value(chunk.clone()).ok()?)
    }

    fn tool_call_fragment(&mut self, fragment: ToolCallDelta) {
        let index = fragment.index.unwrap_or(self.calls.len() as u64);
        let pos = match self.calls.iter().position(|(i, _)| *i == index) {
            Some(p) => p,
            None => {
                self.calls.push((index, ToolCall { id: String::new(), name: String::new(), arguments: String::new() }));
                self.calls.len() - 1
            }
        };
        let call = &mut self.calls[pos].1;
        if let Some(id) = fragment.id.filter(|id| !id.is_empty()) {
            call.id = id;
        }
        let function = fragment.function.unwrap_or_default();
        // A name arrives whole (some servers repeat it in every fragment): assigned, not appended.
        if let Some(name) = function.name.filter(|n| !n.is_empty()) {
            call.name = name;
        }
        if let Some(args) = function.arguments {
            call.arguments.push_str(&args);
        }
    }

    fn usage(&mut self, usage: Option<&ChunkUsage>) {
        if let Some(u) = usage {
            self.completion.prompt_tokens = u.prompt_tokens;
            self.completion.completion_tokens = u.completion_tokens;
        }
    }

    /// Whether the provider said the answer ended (a `finish_reason`).
    pub fn finished(&self) -> bool {
        self.completion.finish_reason.is_some()
    }

    /// A whole (non-streamed) `chat.completion` response.
    pub fn from_response(body: &Value) -> Completion {
        let mut b = CompletionBuilder::default();
        let Ok(chunk) = serde_json::from_value::<Chunk>(body.clone()) else { return b.finish() };
        b.usage(chunk.usage.as_ref());
        if let Some(choice) = chunk.choices.into_iter().next() {
            b.completion.finish_reason = choice.finish_reason;
            let message = choice.message.unwrap_or_default();
            b.completion.content = message.content.unwrap_or_default();
            for (i, mut c) in message.tool_calls.into_iter().enumerate() {
                c.index = Some(i as u64);
                b.tool_call_fragment(c);
            }
        }
        b.finish()
    }

    pub fn finish(mut self) -> Completion {
        self.calls.sort_by_key(|(i, _)| *i);
        self.completion.tool_calls = self
            .calls
            .into_iter()
            .enumerate()
            .map(|(n, (_, mut c))| {
                if c.id.is_empty() {
                    c.id = format!("call_{n}");
                }
                c
            })
            .collect();
        self.completion
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

    #[test]
    fn fences_grow_with_the_round_then_the_token() {
        assert!(step_fence(1, 1) > step_fence(0, 7));
        assert!(step_fence(2, 3) > step_fence(2, 2));
        assert!(FINAL_FENCE > step_fence(10_000, 999_999));
        assert_ne!(step_claim_id("exec_a", 0), step_claim_id("exec_a", 1));
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
    fn streamed_tool_call_fragments_are_assembled_by_index() {
        let mut b = CompletionBuilder::default();
        let chunks = [
            json!({"choices":[{"delta":{"role":"assistant","content":"Let me "}}]}),
            json!({"choices":[{"delta":{"content":"check."}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"search","arguments":""}}]}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":1,"id":"call_b","function":{"name":"weather","arguments":"{\"city\""}}]}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"q\":\"x\"}"}}]}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":":\"Oslo\"}"}}]}}]}),
            json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":12,"completion_tokens":7}}),
        ];
        let tokens: Vec<String> = chunks.iter().filter_map(|c| b.push_chunk(c)).collect();
        assert_eq!(tokens, ["Let me ", "check."]);
        let c = b.finish();
        assert_eq!(c.content, "Let me check.");
        assert_eq!(c.tool_calls.len(), 2);
        assert_eq!(
            c.tool_calls[0],
            ToolCall { id: "call_a".into(), name: "search".into(), arguments: "{\"q\":\"x\"}".into() }
        );
        assert_eq!(c.tool_calls[1].arguments, "{\"city\":\"Oslo\"}");
        assert_eq!((c.prompt_tokens, c.completion_tokens), (Some(12), Some(7)));
    }

    #[test]
    fn a_repeated_function_name_is_assigned_not_appended() {
        let mut b = CompletionBuilder::default();
        for args in ["{\"q\":", "\"x\"}"] {
            b.push_chunk(&json!({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"search","arguments":args}}]}}]}));
        }
        b.push_chunk(&json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}));
        assert!(b.finished());
        let c = b.finish();
        assert_eq!(c.tool_calls[0].name, "search");
        assert_eq!(c.tool_calls[0].arguments, "{\"q\":\"x\"}");
        assert_eq!(c.finish_reason.as_deref(), Some("tool_calls"));
    }

    #[test]
    fn stream_data_is_classified() {
        assert!(matches!(classify_stream_data("[DONE]"), StreamItem::Done));
        assert!(matches!(classify_stream_data("not json"), StreamItem::Ignored));
        assert!(matches!(classify_stream_data(r#"{"choices":[]}"#), StreamItem::Chunk(_)));
        let StreamItem::Error(e) = classify_stream_data(r#"{"error":{"message":"overloaded","code":503}}"#) else {
            panic!("an in-stream error")
        };
        assert!(e.is_retryable());
        assert_eq!(e.describe(), "LLM stream error (503): overloaded");
        let StreamItem::Error(e) = classify_stream_data(r#"{"error":{"message":"bad","code":400}}"#) else {
            panic!("an in-stream error")
        };
        assert!(!e.is_retryable());
        let StreamItem::Error(e) =
            classify_stream_data(r#"{"error":{"message":"x","code":"context_length_exceeded"}}"#)
        else {
            panic!("an in-stream error")
        };
        assert!(e.is_retryable(), "a string code says nothing about retrying; the schedule bounds it");
    }

    #[test]
    fn each_model_attempt_has_its_own_message_id() {
        assert_eq!(attempt_message_id("exec_abc", 0, 1), "msg_abc");
        assert_eq!(attempt_message_id("exec_abc", 0, 2), "msg_abc_r0a2");
        assert_eq!(attempt_message_id("exec_abc", 1, 1), "msg_abc_r1a1");
    }

    #[test]
    fn non_streamed_responses_are_read_too() {
        let body = json!({"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"t","arguments":"{}"}}]}}],"usage":{"prompt_tokens":3,"completion_tokens":1}});
        let c = CompletionBuilder::from_response(&body);
        assert_eq!(c.content, "");
        assert_eq!(c.tool_calls[0].name, "t");
        assert_eq!(c.prompt_tokens, Some(3));
    }

    #[test]
    fn sse_frames_follow_the_seed() {
        let frame = sse_frame("7-0", &token_event("Hello", 0, "msg_123"));
        assert_eq!(frame, "id: 7-0\nevent: token\ndata: {\"index\":0,\"message_id\":\"msg_123\",\"token\":\"Hello\",\"type\":\"token\"}\n\n");
        assert_eq!(done_event("m")["type"], "done");
    }

    #[test]
    fn turn_input_is_validated_by_field() {
        let input: TurnInput = serde_json::from_value(json!({
            "session_id": "s1",
            "assistant": {"id": "a", "instructions": "be brief", "model_config": {"provider": "openai", "model": "m", "temperature": 0.2}, "enabled_tools": ["search"]},
            "messages": [{"role": "user", "content": "hi"}]
        }))
        .unwrap();
        assert_eq!(input.validate(), Ok(()));
        assert_eq!(input.behavior, Behavior::FollowUp);
        let state = TurnState::new(&input, "msg_1".into());
        assert_eq!(state.conversation[0].role, "system");
        assert!(state.enabled("search") && !state.enabled("other"));
        assert_eq!(input.assistant.model_config.model.as_deref(), Some("m"));
        let mut bad = input.clone();
        bad.assistant.model_config.temperature = Some(3.0);
        assert!(bad.validate().unwrap_err().contains("temperature"));
        let mut bad = input.clone();
        bad.messages.clear();
        assert!(bad.validate().unwrap_err().contains("messages"));
        let mut bad = input;
        bad.messages[0].role = "robot".into();
        assert!(bad.validate().unwrap_err().contains("messages[0].role"));
    }

    #[test]
    fn the_seeds_assistant_is_accepted_and_its_silences_get_defaults() {
        let mut input: TurnInput = serde_json::from_value(json!({
            "session_id": "s1",
            "assistant": {"name": "support_assistant", "title": "Support Assistant", "description": "Helps users",
                "created_at": "2026-01-20T12:00:00Z", "instructions": "be brief"},
            "messages": [{"role": "user", "content": "hi"}]
        }))
        .unwrap();
        input.apply_defaults("openai", "gpt-4o");
        assert_eq!(input.validate(), Ok(()));
        assert_eq!(input.assistant.id, "support_assistant", "the seed's name stands for a missing id");
        let config = &input.assistant.model_config;
        assert_eq!(config.provider.as_deref(), Some("openai"));
        assert_eq!(config.model.as_deref(), Some("gpt-4o"));
        assert_eq!(config.temperature, Some(DEFAULT_TEMPERATURE));
        assert_eq!(input.check_provider(&["openai"]), Ok(()));
        let stored = serde_json::to_value(TurnState::new(&input, "m".into())).unwrap();
        assert_eq!(stored["assistant"]["title"], "Support Assistant");

        let mut named = input.clone();
        named.assistant.model_config.provider = Some("other".into());
        let e = named.check_provider(&["openai", "b"]).unwrap_err();
        assert!(e.starts_with("assistant.model_config.provider"), "{e}");
        let unknown = serde_json::from_value::<TurnInput>(
            json!({"session_id": "s", "assistant": {"id": "a", "colour": "red"}, "messages": []}),
        );
        assert!(unknown.unwrap_err().to_string().contains("colour"), "a field the seed lacks is refused");
        let mut anonymous = input;
        anonymous.assistant.id.clear();
        anonymous.assistant.name = None;
        assert!(anonymous.validate().unwrap_err().contains("assistant.id"));
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
    fn arguments_must_be_objects() {
        assert_eq!(parse_arguments("").unwrap(), json!({}));
        assert!(parse_arguments("[1]").is_err());
        assert!(parse_arguments("{bad").is_err());
    }

    #[test]
    fn large_tool_results_are_cut_at_a_char_boundary_for_the_model() {
        let small = CallOutcome { ok: true, result: json!({"n": 1}) };
        assert_eq!(tool_message_content(&small, 100), r#"{"n":1}"#);
        let failed = CallOutcome { ok: false, result: json!("HTTP 404") };
        assert_eq!(tool_message_content(&failed, 100), r#"{"error":"HTTP 404"}"#);
        let flat = CallOutcome { ok: false, result: json!({"error": "tool_unavailable", "tool": "t"}) };
        assert_eq!(tool_message_content(&flat, 100), r#"{"error":"tool_unavailable","tool":"t"}"#);
        let big = CallOutcome { ok: true, result: json!("é".repeat(100)) };
        let seen: Value = serde_json::from_str(&tool_message_content(&big, 10)).unwrap();
        assert_eq!(seen["truncated"], true);
        assert_eq!(seen["bytes"], 202);
        // 10 bytes would split an 'é' (the text starts with a quote): cut at 9.
        assert_eq!(seen["content"], format!("\"{}", "é".repeat(4)));
    }

    #[test]
    fn error_events_carry_sanitised_messages() {
        let e = error_event("x", "failed at https://u:p@h.example/a?k=v\n\tat Foo.bar(Foo.java:1)", None, "m");
        assert_eq!(e["error"]["message"], "failed at https://h.example/a");
    }
}
