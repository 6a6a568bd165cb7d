//! Seed 002's `ExternalResult`: how any tool call ended (a callback, a client tool, an MCP tool),
//! the safe error it carries, and the `Observation` the model reads of it.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// The fixed code and message that replace an error whose own would leak or break the rules.
pub const UNSAFE_ERROR_CODE: &str = "TOOL_ERROR";
pub const UNSAFE_ERROR_MESSAGE: &str = "The tool reported an error; its details are not shown";
/// Seed 002's bounds on an error: a code of at most 64 of `[A-Za-z0-9_.-]`, a message of at most
/// 512 characters on one line.
pub const MAX_CODE_CHARS: usize = 64;
pub const MAX_MESSAGE_CHARS: usize = 512;

/// How a call ended. Only `success` is a success: the others are never promoted to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ResultStatus {
    Success,
    Failed,
    Cancelled,
    Timeout,
    /// The call may or may not have had its effect: reconcile before trying again.
    Unknown,
}

impl ResultStatus {
    pub fn parse(text: &str) -> Option<Self> {
        serde_json::from_value(Value::String(text.to_string())).ok()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ResultStatus::Success => "success",
            ResultStatus::Failed => "failed",
            ResultStatus::Cancelled => "cancelled",
            ResultStatus::Timeout => "timeout",
            ResultStatus::Unknown => "unknown",
        }
    }
}

/// A safe error: a short code and one clean line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct InteractionError {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
}

impl InteractionError {
    /// `code` and `message` as given when both keep seed 002's rules, else the fixed safe pair
    /// (a diagnostic that names a credential, a path or a stack is never passed on).
    pub fn safe(code: &str, message: &str, retryable: Option<bool>) -> Self {
        if is_safe_code(code) && is_safe_message(message) {
            InteractionError { code: code.to_string(), message: message.to_string(), retryable }
        } else if is_safe_code(code) {
            InteractionError { code: code.to_string(), message: UNSAFE_ERROR_MESSAGE.into(), retryable }
        } else {
            InteractionError { code: UNSAFE_ERROR_CODE.into(), message: UNSAFE_ERROR_MESSAGE.into(), retryable }
        }
    }

    /// The fleet's own error (its code is a constant): its message sanitised (one line, URLs and
    /// credentials scrubbed), as the fleet's records already show it.
    pub fn fleet(code: &'static str, message: &str) -> Self {
        let message = crate::sanitize::sanitize_error(message);
        let message = if message.is_empty() { "The tool call failed".to_string() } else { message };
        InteractionError { code: code.to_string(), message, retryable: None }
    }

    /// A tool's `error` object, whatever shape it came in.
    fn from_value(value: &Value, fallback_code: &str) -> Self {
        let code = value.get("code").and_then(Value::as_str).unwrap_or(fallback_code);
        let message = match value {
            Value::String(s) => s.as_str(),
            _ => value.get("message").and_then(Value::as_str).unwrap_or(""),
        };
        let message = if message.is_empty() { "The tool reported a failure" } else { message };
        InteractionError::safe(code, message, value.get("retryable").and_then(Value::as_bool))
    }
}

pub fn is_safe_code(code: &str) -> bool {
    !code.is_empty()
        && code.len() <= MAX_CODE_CHARS
        && code.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

/// One line, at most 512 characters, no control characters, credentials, absolute paths or stack
/// frames.
pub fn is_safe_message(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    let credential = ["api_key", "apikey", "api-key", "password", "secret", "token", "bearer ", "authorization", "sk-"]
        .iter()
        .any(|word| lower.contains(word));
    let path = message.split_whitespace().any(|w| {
        let w = w.trim_start_matches(['\'', '"', '(', '[']);
        (w.starts_with('/') && w.len() > 1) || (w.len() > 2 && w.as_bytes()[1] == b':' && w.as_bytes()[2] == b'\\')
    });
    let stack = lower.contains("traceback") || lower.contains("stack backtrace") || message.contains("\tat ");
    !message.is_empty()
        && message.chars().count() <= MAX_MESSAGE_CHARS
        && !message.chars().any(char::is_control)
        && !credential
        && !path
        && !stack
        && !message.contains("://")
}

/// A reference to content held elsewhere (an artifact, a file, a URL).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ResultReference {
    pub uri: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// Seed 002's `ExternalResult`, as the execution record, the turn and the console keep it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ExternalResult {
    pub call_id: String,
    /// The tool's name; `server:tool` for an MCP tool.
    pub source: String,
    pub status: ResultStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schema(value_type = Option<Object>))]
    pub content: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schema(value_type = Option<Object>))]
    pub structured_content: Option<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub references: Vec<ResultReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<InteractionError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schema(value_type = Option<Object>))]
    pub metadata: Option<Value>,
}

/// The keys that make an answer seed 002's shape rather than a bare value.
const SHAPE_KEYS: [&str; 4] = ["status", "content", "structuredContent", "references"];

impl ExternalResult {
    pub fn success(call_id: &str, source: &str, structured: Value) -> Self {
        ExternalResult {
            call_id: call_id.into(),
            source: source.into(),
            status: ResultStatus::Success,
            content: None,
            structured_content: Some(structured),
            references: vec![],
            error: None,
            metadata: None,
        }
    }

    /// A call that did not succeed, with its (safe) error.
    pub fn ended(call_id: &str, source: &str, status: ResultStatus, error: InteractionError) -> Self {
        ExternalResult {
            call_id: call_id.into(),
            source: source.into(),
            status,
            content: None,
            structured_content: None,
            references: vec![],
            error: Some(error),
            metadata: None,
        }
    }

    /// Reads a tool's answer as seed 002's shape when it is one: an object with a known `status`,
    /// or (bare, with no `result`) one with `content`, `structuredContent` or `references`. `None`:
    /// a plain value, which stays the seed's `result`.
    pub fn from_answer(call_id: &str, source: &str, answer: &Value) -> Option<Self> {
        let map = answer.as_object()?;
        let status = match map.get("status") {
            Some(Value::String(s)) => Some(ResultStatus::parse(s)?),
            Some(_) => return None,
            None => None,
        };
        if status.is_none() && !SHAPE_KEYS[1..].iter().any(|k| map.contains_key(*k)) {
            return None;
        }
        let references = map
            .get("references")
            .and_then(|r| serde_json::from_value::<Vec<ResultReference>>(r.clone()).ok())
            .unwrap_or_default()
            .into_iter()
            .filter(|r| !r.uri.is_empty())
            .collect();
        let mut result = ExternalResult {
            call_id: call_id.into(),
            source: source.into(),
            status: status.unwrap_or(ResultStatus::Success),
            content: map.get("content").cloned(),
            structured_content: map.get("structuredContent").cloned(),
            references,
            error: None,
            metadata: map.get("metadata").filter(|m| m.is_object()).cloned(),
        };
        result.error = match (result.status, map.get("error")) {
            (ResultStatus::Success, _) => None,
            (_, Some(e)) => Some(InteractionError::from_value(e, "TOOL_FAILED")),
            (status, None) => {
                Some(InteractionError::safe("TOOL_FAILED", &format!("The tool ended {}", status.as_str()), None))
            }
        };
        Some(result)
    }

    /// A call that was dead-lettered: `timeout` when its last attempt ran out of time, else
    /// `failed`, with the last error made safe.
    pub fn dead_lettered(call_id: &str, source: &str, timed_out: bool, last_error: &str) -> Self {
        let (status, code) =
            if timed_out { (ResultStatus::Timeout, "TIMEOUT") } else { (ResultStatus::Failed, "TOOL_CALL_FAILED") };
        let mut error = InteractionError::fleet(code, last_error);
        error.retryable = Some(false);
        ExternalResult::ended(call_id, source, status, error)
    }

    /// A call cancelled before it was sent.
    pub fn cancelled(call_id: &str, source: &str) -> Self {
        let error = InteractionError::fleet("CANCELLED", "The tool call was cancelled before it was sent");
        ExternalResult::ended(call_id, source, ResultStatus::Cancelled, error)
    }

    /// Passes every text and JSON value of the result through `scrub`, in place (a text as a JSON
    /// string): a redaction without turning the whole result into JSON and back. Destructured
    /// whole, so a field added later cannot be passed over.
    pub fn scrub_with(&mut self, scrub: impl Fn(&mut Value)) {
        let text = |s: &mut String| {
            let mut value = Value::String(std::mem::take(s));
            scrub(&mut value);
            *s = match value {
                Value::String(clean) => clean,
                other => other.to_string(),
            };
        };
        let ExternalResult { call_id, source, status: _, content, structured_content, references, error, metadata } =
            self;
        text(call_id);
        text(source);
        for value in [content, structured_content, metadata].into_iter().flatten() {
            scrub(value);
        }
        for ResultReference { uri, media_type, digest } in references {
            text(uri);
            media_type.iter_mut().chain(digest.iter_mut()).for_each(text);
        }
        if let Some(InteractionError { code, message, retryable: _ }) = error {
            text(code);
            text(message);
        }
    }

    pub fn is_success(&self) -> bool {
        self.status == ResultStatus::Success
    }

    /// What the model reads (seed 002's `Observation.message.content`, as one string for an
    /// OpenAI-compatible `tool` message): a single text block as it is, else the JSON of the
    /// text/json/reference parts; a result that did not succeed says so with its safe error.
    pub fn observation_text(&self) -> String {
        let mut parts = Vec::new();
        match &self.content {
            Some(Value::String(text)) => parts.push(json!({"type": "text", "text": text})),
            Some(Value::Array(blocks)) => parts.extend(blocks.iter().map(content_part)),
            Some(Value::Null) | None => {}
            Some(other) => parts.push(json!({"type": "json", "data": other})),
        }
        if let Some(data) = &self.structured_content {
            parts.push(json!({"type": "json", "data": data}));
        }
        parts.extend(self.references.iter().map(|r| json!({"type": "reference", "reference": r})));
        if let Some(error) = self.error.as_ref().filter(|_| !self.is_success()) {
            let summary = format!("{}: error {}: {}", self.status.as_str(), error.code, error.message);
            parts.insert(0, json!({"type": "text", "text": summary}));
        }
        match parts.as_slice() {
            [only] if only["type"] == "text" => only["text"].as_str().unwrap_or_default().to_string(),
            [] => String::new(),
            _ => Value::Array(parts).to_string(),
        }
    }

    /// The result bounded to `max_bytes` of serialised content: past it, `structuredContent`
    /// becomes `{"truncated": true, "bytes": …, "text": <its head>}` (cut on a character) and
    /// `content`'s text is cut the same way.
    pub fn bounded(mut self, max_bytes: usize) -> Self {
        if let Some(data) = self.structured_content.take() {
            let text = data.to_string();
            self.structured_content = Some(if text.len() <= max_bytes {
                data
            } else {
                json!({"truncated": true, "bytes": text.len(), "text": head(&text, max_bytes)})
            });
        }
        if let Some(Value::String(text)) = &mut self.content {
            if text.len() > max_bytes {
                *text = head(text, max_bytes).to_string();
                let meta = self.metadata.get_or_insert_with(|| Value::Object(Map::new()));
                if let Some(m) = meta.as_object_mut() {
                    m.insert("truncated".into(), Value::Bool(true));
                }
            }
        }
        self
    }
}

/// An MCP content block as an observation part: text stays text, anything else is data.
fn content_part(block: &Value) -> Value {
    match (block.get("type").and_then(Value::as_str), block.get("text").and_then(Value::as_str)) {
        (Some("text"), Some(text)) => json!({"type": "text", "text": text}),
        (Some("reference"), _) => block.clone(),
        _ => json!({"type": "json", "data": block}),
    }
}

/// The first `max_bytes` of `text`, cut on a character boundary.
fn head(text: &str, max_bytes: usize) -> &str {
    let mut cut = max_bytes.min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrub_in_place_reaches_what_a_scrub_of_its_json_reaches() {
        const SECRET: &str = "s3cr3t-VALUE-42";
        let redactor = crate::redact::Redactor::new([SECRET]);
        let mut result = ExternalResult {
            call_id: format!("c-{SECRET}"),
            source: format!("srv:{SECRET}"),
            status: ResultStatus::Failed,
            content: Some(json!([{"text": SECRET}])),
            structured_content: Some(json!({SECRET: [SECRET]})),
            references: vec![ResultReference {
                uri: format!("https://x/{SECRET}"),
                media_type: Some(SECRET.into()),
                digest: Some(SECRET.into()),
            }],
            error: Some(InteractionError { code: SECRET.into(), message: SECRET.into(), retryable: Some(true) }),
            metadata: Some(json!({"k": SECRET})),
        };
        let mut whole = serde_json::to_value(&result).unwrap();
        redactor.redact_json(None, &mut whole);
        result.scrub_with(|v| redactor.redact_json(None, v));
        assert_eq!(serde_json::to_value(&result).unwrap(), whole);
        assert!(!whole.to_string().contains(SECRET));
    }

    #[test]
    fn a_failed_status_is_a_failure_bare_or_not() {
        let answer = json!({"status": "failed", "error": {"code": "NOT_FOUND", "message": "No such order"}});
        let r = ExternalResult::from_answer("c1", "orders", &answer).unwrap();
        assert_eq!(r.status, ResultStatus::Failed);
        assert_eq!(r.error.as_ref().unwrap().code, "NOT_FOUND");
        assert_eq!(r.observation_text(), "failed: error NOT_FOUND: No such order");
        let no_error = ExternalResult::from_answer("c1", "t", &json!({"status": "timeout"})).unwrap();
        assert_eq!(no_error.error.unwrap().code, "TOOL_FAILED");
    }

    #[test]
    fn plain_values_are_not_the_shape() {
        for plain in [json!({"temperature": 21}), json!(3), json!({"status": "shipped"}), json!({"status": 3})] {
            assert_eq!(ExternalResult::from_answer("c", "t", &plain), None, "{plain}");
        }
    }

    #[test]
    fn structured_content_in_a_bare_answer_is_kept() {
        let answer = json!({"content": [{"type": "text", "text": "21 C"}], "structuredContent": {"c": 21}});
        let r = ExternalResult::from_answer("c", "weather", &answer).unwrap();
        assert!(r.is_success());
        assert_eq!(r.structured_content, Some(json!({"c": 21})));
        assert_eq!(r.observation_text(), r#"[{"text":"21 C","type":"text"},{"data":{"c":21},"type":"json"}]"#);
        let text = ExternalResult::from_answer("c", "read", &json!({"content": "file text"})).unwrap();
        assert_eq!(text.observation_text(), "file text");
    }

    #[test]
    fn unsafe_errors_are_replaced() {
        let leaks = [
            "bad key api_key='sk-live-123'",
            "open /etc/passwd failed",
            "Traceback (most recent call last)",
            "line one\nline two",
            "see https://x.example/?token=1",
        ];
        for message in leaks {
            let e = InteractionError::safe("E", message, None);
            assert_eq!(e.message, UNSAFE_ERROR_MESSAGE, "{message}");
            assert_eq!(e.code, "E");
        }
        assert_eq!(InteractionError::safe("bad code!", "fine", None).code, UNSAFE_ERROR_CODE);
        assert_eq!(InteractionError::safe(&"C".repeat(65), "fine", None).code, UNSAFE_ERROR_CODE);
        assert_eq!(InteractionError::safe("NOT_FOUND", "No such order", Some(false)).message, "No such order");
    }

    #[test]
    fn bounded_results_keep_utf8_whole() {
        let r = ExternalResult::success("c", "t", json!({"s": "é".repeat(100)}));
        let cut = r.bounded(51);
        let data = cut.structured_content.unwrap();
        assert_eq!(data["truncated"], true);
        assert!(data["text"].as_str().unwrap().len() <= 51);
        let mut text = ExternalResult::success("c", "t", json!(1));
        text.content = Some(json!("ééé"));
        let text = text.bounded(3);
        assert_eq!(text.content, Some(json!("é")));
        assert_eq!(text.metadata.unwrap()["truncated"], true);
    }

    #[test]
    fn a_dead_letter_is_a_timeout_or_a_failure() {
        let late = ExternalResult::dead_lettered("c", "t", true, "timed out after 30s");
        assert_eq!((late.status, late.error.unwrap().code.as_str()), (ResultStatus::Timeout, "TIMEOUT"));
        let gone = ExternalResult::dead_lettered("c", "t", false, "HTTP 500: oops\nat x");
        assert_eq!(gone.status, ResultStatus::Failed);
        assert_eq!(ExternalResult::cancelled("c", "t").status, ResultStatus::Cancelled);
    }

    #[test]
    fn statuses_round_trip() {
        for s in ["success", "failed", "cancelled", "timeout", "unknown"] {
            assert_eq!(ResultStatus::parse(s).unwrap().as_str(), s);
        }
        assert_eq!(ResultStatus::parse("done"), None);
    }
}
