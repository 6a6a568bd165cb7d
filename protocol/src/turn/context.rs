//! A model's context window: which window a call has (the assistant's `context_window`, else the
//! fleet's for its model), what a prompt is estimated to take of it, and the turn's end when it
//! does not fit, decided before the model is called (nothing spent on a call bound to fail).

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// The largest window a model may be said to have (tokens).
pub const MAX_CONTEXT_WINDOW: u32 = 10_000_000;

/// The `error` code of a turn whose prompt does not fit its model's window.
pub const CONTEXT_LIMIT_EXCEEDED: &str = "context_limit_exceeded";

/// What a message costs besides its text: its role and the format's framing.
const MESSAGE_OVERHEAD_TOKENS: u64 = 4;

/// Bytes per token of the estimate: about what English text takes in the common tokenizers.
const BYTES_PER_TOKEN: u64 = 4;

/// The tokens a prompt (OpenAI-format `messages` and tool specs) is estimated to take: a quarter
/// token per byte of every message's content, its tool calls' names and arguments and its tool
/// call id, plus [`MESSAGE_OVERHEAD_TOKENS`] per message, plus a quarter token per byte of the
/// tool specs' JSON. An estimate, not a count: each model has its own tokenizer (one tokenizer
/// crate would be exact for a few models and wrong for the rest, and heavy to ship), and the
/// provider still refuses what it cannot take. The check it feeds only spares calls that cannot
/// fit.
pub fn estimate_prompt_tokens(messages: &[Value], tools: &[Value]) -> u64 {
    let text = |v: &Value| match v {
        Value::Null => 0,
        Value::String(s) => s.len(),
        other => other.to_string().len(),
    };
    let message_bytes = |m: &Value| {
        let calls = m["tool_calls"].as_array().into_iter().flatten();
        let call_bytes: usize = calls.map(|c| text(&c["function"]["name"]) + text(&c["function"]["arguments"])).sum();
        text(&m["content"]) + call_bytes + text(&m["tool_call_id"])
    };
    let messages_bytes: usize = messages.iter().map(message_bytes).sum();
    let tools_bytes: usize = tools.iter().map(|t| t.to_string().len()).sum();
    let tokens = |bytes: usize| (bytes as u64).div_ceil(BYTES_PER_TOKEN);
    tokens(messages_bytes) + MESSAGE_OVERHEAD_TOKENS * messages.len() as u64 + tokens(tools_bytes)
}

/// The window a call to `model` has: the assistant's own (`model_config.context_window`) wins
/// over the fleet's for the model (`FLEET_LLM_CONTEXT_WINDOWS`); `None`: unknown, not checked.
pub fn context_window(assistant: Option<u32>, fleet: &BTreeMap<String, u32>, model: &str) -> Option<u32> {
    assistant.or_else(|| fleet.get(model).copied())
}

/// A prompt that does not fit its model's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextOverflow {
    /// The model's window (tokens).
    pub context_limit: u32,
    /// The prompt's estimated tokens.
    pub actual_tokens: u64,
}

impl ContextOverflow {
    /// What the client is told: what happened and what to do.
    pub fn message(&self) -> String {
        format!(
            "the conversation is about {} tokens, more than the model's context window of {}: compact the session \
             (POST a {{\"type\":\"compaction\"}} event) or start a new session",
            self.actual_tokens, self.context_limit
        )
    }

    /// The turn's `error` event (code `context_limit_exceeded`, with the window and the estimate).
    pub fn error_event(&self, message_id: &str) -> Value {
        let mut event = super::error_event(CONTEXT_LIMIT_EXCEEDED, &self.message(), None, message_id);
        event["error"]["context_limit"] = json!(self.context_limit);
        event["error"]["actual_tokens"] = json!(self.actual_tokens);
        event
    }
}

/// Whether a prompt of `estimate` tokens overflows `window` (`None`: no window known, it fits).
pub fn check_context(estimate: u64, window: Option<u32>) -> Option<ContextOverflow> {
    let limit = window?;
    (estimate > u64::from(limit)).then_some(ContextOverflow { context_limit: limit, actual_tokens: estimate })
}

/// `FLEET_LLM_CONTEXT_WINDOWS`: comma-separated `MODEL=TOKENS` (a model's name may hold `=`; the
/// last one splits), each 1..=[`MAX_CONTEXT_WINDOW`].
pub fn parse_context_windows(text: &str) -> Result<BTreeMap<String, u32>, String> {
    let mut windows = BTreeMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (model, tokens) = entry.rsplit_once('=').ok_or_else(|| format!("{entry:?} is not MODEL=TOKENS"))?;
        let model = model.trim();
        if model.is_empty() || model.len() > 256 || model.chars().any(char::is_control) {
            return Err(format!("{entry:?} names no model"));
        }
        let tokens: u32 = tokens.trim().parse().map_err(|_| format!("{entry:?}: {tokens:?} is not a number"))?;
        if !(1..=MAX_CONTEXT_WINDOW).contains(&tokens) {
            return Err(format!("{entry:?}: a window is 1-{MAX_CONTEXT_WINDOW} tokens"));
        }
        if windows.insert(model.to_string(), tokens).is_some() {
            return Err(format!("{model:?} is listed twice"));
        }
    }
    Ok(windows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_counts_contents_tool_calls_schemas_and_each_message() {
        let messages = [
            json!({"role": "system", "content": "12345678"}),
            json!({"role": "user", "content": "1234"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "ab", "arguments": "{}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "12"}),
        ];
        // 8 + 4 + (2 + 2) + (2 + 2) = 20 bytes: 5 tokens, and 4 messages of 4.
        assert_eq!(estimate_prompt_tokens(&messages, &[]), 5 + 16);
        let tool = json!({"type": "function"});
        let bytes = tool.to_string().len() as u64;
        assert_eq!(estimate_prompt_tokens(&messages, &[tool]), 21 + bytes.div_ceil(4));
        assert_eq!(estimate_prompt_tokens(&[], &[]), 0);
        // A part of a byte is a whole token: the estimate never rounds a prompt down.
        assert_eq!(estimate_prompt_tokens(&[json!({"content": "x"})], &[]), 1 + 4);
    }

    #[test]
    fn the_assistants_window_wins_over_the_fleets() {
        let fleet = BTreeMap::from([("small".to_string(), 100)]);
        assert_eq!(context_window(Some(50), &fleet, "small"), Some(50));
        assert_eq!(context_window(None, &fleet, "small"), Some(100));
        assert_eq!(context_window(None, &fleet, "other"), None);
    }

    #[test]
    fn a_prompt_over_its_window_overflows_and_one_at_it_fits() {
        assert_eq!(check_context(51, Some(50)), Some(ContextOverflow { context_limit: 50, actual_tokens: 51 }));
        assert_eq!(check_context(50, Some(50)), None);
        assert_eq!(check_context(u64::MAX, None), None, "no known window: nothing is checked");
    }

    #[test]
    fn the_overflow_event_says_what_to_do_with_the_figures() {
        let event = ContextOverflow { context_limit: 50, actual_tokens: 260 }.error_event("msg_a");
        assert_eq!(event["type"], "error");
        let error = &event["error"];
        assert_eq!((error["code"].as_str(), error["context_limit"].as_u64()), (Some(CONTEXT_LIMIT_EXCEEDED), Some(50)));
        assert_eq!(error["actual_tokens"], 260);
        let message = error["message"].as_str().unwrap();
        assert!(message.contains("compaction") && message.contains("new session"), "{message}");
    }

    #[test]
    fn fleet_windows_are_read_by_model() {
        let windows = parse_context_windows(" gpt-4o=128000, org/model=v2=8192 ,").unwrap();
        assert_eq!(windows, BTreeMap::from([("gpt-4o".into(), 128_000), ("org/model=v2".into(), 8192)]));
        assert_eq!(parse_context_windows("").unwrap(), BTreeMap::new());
        for bad in ["gpt-4o", "=5", "m=0", "m=10000001", "m=x", "m=1,m=2"] {
            assert!(parse_context_windows(bad).is_err(), "{bad}");
        }
    }
}
