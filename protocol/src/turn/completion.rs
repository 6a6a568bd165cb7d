//! Assembling an OpenAI-compatible model response, streamed (`chat.completion.chunk`s with content
//! tokens and `delta.tool_calls` fragments) or whole, into one completion. A reasoning model's
//! thinking (`reasoning_content`, or `reasoning` on some servers) is assembled apart from the
//! answer: it is shown once as its own event, and never joins the conversation.

use serde::Deserialize;
use serde_json::Value;

use super::state::ToolCall;

/// What one model call produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Completion {
    pub content: String,
    /// What a reasoning model thought before it answered (empty: it said nothing of it). Never
    /// part of the answer, the history or a later prompt.
    pub reasoning: String,
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
    /// A reasoning model's thinking, as DeepSeek, vLLM and llama.cpp name it.
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// The same, as OpenRouter and Ollama name it.
    #[serde(default)]
    pub reasoning: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ToolCallDelta>,
}

impl Delta {
    /// The reasoning this delta (or whole message) carries, under either name. A server that sends
    /// both sends the same text twice: `reasoning_content` is read, `reasoning` only without it.
    fn thinking(&mut self) -> Option<String> {
        let named = self.reasoning_content.take().filter(|t| !t.is_empty());
        named.or_else(|| self.reasoning.take()).filter(|t| !t.is_empty())
    }
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
        let mut delta = choice.delta?;
        for fragment in std::mem::take(&mut delta.tool_calls) {
            self.tool_call_fragment(fragment);
        }
        if let Some(thought) = delta.thinking() {
            self.completion.reasoning.push_str(&thought);
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
            let mut message = choice.message.unwrap_or_default();
            b.completion.reasoning = message.thinking().unwrap_or_default();
            b.completion.content = message.content.unwrap_or_default();
            for (i, mut c) in message.tool_calls.into_iter().enumerate() {
                c.index = Some(i as u64);
                b.tool_call_fragment(c);
            }
        }
        b.finish()
    }

    /// The completion, its tool calls in the model's order; a call the model gave no id keeps an
    /// empty one until `Completion::name_calls` names it.
    pub fn finish(mut self) -> Completion {
        self.calls.sort_by_key(|(i, _)| *i);
        self.completion.tool_calls = self.calls.into_iter().map(|(_, c)| c).collect();
        self.completion
    }
}

impl Completion {
    /// Names the calls the model gave no id (some OpenAI-compatible servers give none) after their
    /// round and place, so the model can tell their results apart from every other round's.
    pub fn name_calls(&mut self, round: u32) {
        for (n, call) in self.tool_calls.iter_mut().enumerate() {
            if call.id.is_empty() {
                call.id = format!("call_r{round}_{n}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
    fn calls_without_ids_are_named_by_round_and_place() {
        let mut b = CompletionBuilder::default();
        b.push_chunk(
            &json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"a","arguments":"{}"}}]}}]}),
        );
        b.push_chunk(&json!({"choices":[{"delta":{"tool_calls":[{"index":1,"id":"given","function":{"name":"b","arguments":"{}"}}]}}]}));
        let mut c = b.finish();
        c.name_calls(3);
        let ids: Vec<&str> = c.tool_calls.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["call_r3_0", "given"]);
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
    fn streamed_reasoning_is_assembled_apart_from_the_answer_under_either_name() {
        for name in ["reasoning_content", "reasoning"] {
            let mut b = CompletionBuilder::default();
            let chunks = [
                json!({"choices":[{"delta":{"role":"assistant","content":""}}]}),
                json!({"choices":[{"delta":{name:"Think "}}]}),
                json!({"choices":[{"delta":{name:"hard.", "content":null}}]}),
                json!({"choices":[{"delta":{"content":"Answer."}}]}),
                json!({"choices":[{"delta":{},"finish_reason":"stop"}]}),
            ];
            let tokens: Vec<String> = chunks.iter().filter_map(|c| b.push_chunk(c)).collect();
            assert_eq!(tokens, ["Answer."], "{name}: reasoning is never an answer token");
            let c = b.finish();
            assert_eq!((c.reasoning.as_str(), c.content.as_str()), ("Think hard.", "Answer."), "{name}");
        }
    }

    #[test]
    fn a_delta_naming_its_reasoning_twice_is_read_once() {
        let mut b = CompletionBuilder::default();
        b.push_chunk(&json!({"choices":[{"delta":{"reasoning_content":"once","reasoning":"once"}}]}));
        b.push_chunk(&json!({"choices":[{"delta":{"reasoning_content":"","reasoning":" more"}}]}));
        assert_eq!(b.finish().reasoning, "once more");
    }

    #[test]
    fn whole_responses_carry_their_reasoning_under_either_name() {
        for name in ["reasoning_content", "reasoning"] {
            let body = json!({"choices":[{"message":{"role":"assistant","content":"42", name:"Let me count."},"finish_reason":"stop"}]});
            let c = CompletionBuilder::from_response(&body);
            assert_eq!((c.reasoning.as_str(), c.content.as_str()), ("Let me count.", "42"), "{name}");
        }
        let plain = CompletionBuilder::from_response(&json!({"choices":[{"message":{"content":"hi"}}]}));
        assert_eq!(plain.reasoning, "", "no reasoning: nothing to show");
    }
}
