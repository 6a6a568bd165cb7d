//! The LLM client: any OpenAI-compatible `/chat/completions`, streamed (the body decoded as one
//! UTF-8 event stream, so a network split inside a character or an event changes nothing;
//! `delta.tool_calls` fragments assembled into whole calls), with a non-streaming fallback when the
//! server answers with a plain JSON completion. What the worker holds of a response is bounded,
//! and every text the provider sends (content, reasoning, tool calls, errors) passes the worker's `Redactor`
//! before it goes anywhere: a provider may echo the key it was called with.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use eventsource_stream::{EventStreamError, Eventsource};
use fleet_protocol::budget::ProviderLimits;
use fleet_protocol::classify::{classify_status, ResponseClass};
use fleet_protocol::redact::Redactor;
use fleet_protocol::sanitize::sanitize_error;
use fleet_protocol::turn::{classify_stream_data, Completion, CompletionBuilder, StreamItem};

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq)]
pub enum LlmError {
    /// 408/429/5xx, timeouts and network errors: retry on the broker-held schedule.
    Retryable { status: Option<u16>, retry_after: Option<Duration>, message: String },
    /// Other 4xx, or no LLM configured: the turn ends with an error.
    Permanent { status: Option<u16>, message: String },
}

impl LlmError {
    pub fn message(&self) -> &str {
        match self {
            LlmError::Retryable { message, .. } | LlmError::Permanent { message, .. } => message,
        }
    }
    pub fn status(&self) -> Option<u16> {
        match self {
            LlmError::Retryable { status, .. } | LlmError::Permanent { status, .. } => *status,
        }
    }
}

/// A client per configured provider, by name, and where each one falls back to.
#[derive(Clone)]
pub struct LlmClients {
    clients: std::collections::HashMap<String, LlmClient>,
    routing: fleet_platform::config::LlmRouting,
}

impl LlmClients {
    pub fn new(config: &crate::config::WorkerConfig) -> Self {
        let clients = config
            .llm_providers
            .iter()
            .map(|p| {
                let client = LlmClient::new(
                    p.base_url.clone(),
                    p.api_key.clone(),
                    config.llm_timeout,
                    config.llm_max_response_bytes,
                    &config.common.tls,
                    config.redactor.clone(),
                );
                (p.name.clone(), client)
            })
            .collect();
        LlmClients { clients, routing: config.common.llm.clone() }
    }

    /// The named provider's client (a turn's state naming none means the default provider).
    pub fn get(&self, provider: Option<&str>) -> Result<(&str, &LlmClient), LlmError> {
        let name = provider.unwrap_or(&self.routing.default_provider);
        match self.clients.get_key_value(name) {
            Some((name, client)) => Ok((name.as_str(), client)),
            None => Err(LlmError::Permanent {
                status: None,
                message: format!("the provider {name:?} is not configured on this worker (FLEET_LLM_PROVIDERS)"),
            }),
        }
    }

    /// The provider tried once more, within the same attempt, after `provider` failed retryably.
    pub fn fallback_of(&self, provider: &str) -> Option<&str> {
        self.routing.fallback_of(provider)
    }

    /// The model a turn's state naming none runs (states stored before the dispatcher filled it).
    pub fn default_model(&self) -> &str {
        &self.routing.default_model
    }
}

#[derive(Clone)]
pub struct LlmClient {
    http: reqwest::Client,
    base_url: Option<String>,
    api_key: Option<String>,
    /// The most bytes of one response the worker holds (`FLEET_LLM_MAX_RESPONSE_BYTES`).
    max_response_bytes: usize,
    /// The worker's secrets, this client's key among them.
    redactor: Arc<Redactor>,
}

/// One model call's request.
#[derive(Clone)]
pub struct ChatRequest<'a> {
    pub model: &'a str,
    pub temperature: Option<f64>,
    pub max_tokens: u32,
    pub messages: Vec<Value>,
    pub tools: Vec<Value>,
    /// The provider's JSON-schema response format (`{"type": "json_schema", …}`), when the
    /// answer must match an output schema.
    pub response_format: Option<Value>,
}

/// Why reading a response body stopped early.
#[derive(Debug)]
enum BodyFailure {
    Network(reqwest::Error),
    TooLarge(usize),
}

impl LlmClient {
    pub fn new(
        base_url: Option<String>,
        api_key: Option<String>,
        timeout: Duration,
        max_response_bytes: usize,
        tls: &fleet_platform::tls::ClientTls,
        redactor: Arc<Redactor>,
    ) -> Self {
        // The outgoing policy of callbacks too (no redirect, no proxy), and no resolver guard: a
        // self-hosted model on a private address is the operator's own choice of endpoint.
        let http = crate::http::outbound(timeout, tls).build().expect("the LLM HTTP client builds");
        let base_url = base_url.map(|u| u.trim_end_matches('/').to_string());
        LlmClient { http, base_url, api_key, max_response_bytes, redactor }
    }

    /// A provider's text fit to keep: secrets redacted (before sanitising, whose cut could
    /// otherwise leave a secret's head), then sanitised.
    fn scrub(&self, text: &str) -> String {
        sanitize_error(&self.redactor.redact(text))
    }

    /// Calls the model, handing every content token to `on_token` as it streams in; with the
    /// call's outcome, what the provider's answer said about its limits (any status).
    pub async fn complete<F, Fut>(
        &self,
        req: ChatRequest<'_>,
        traceparent: Vec<(String, String)>,
        on_token: F,
    ) -> (Result<Completion, LlmError>, ProviderLimits)
    where
        F: FnMut(String) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let mut limits = ProviderLimits::default();
        let result = self.read(req, traceparent, on_token, &mut limits).await;
        (result, limits)
    }

    async fn read<F, Fut>(
        &self,
        req: ChatRequest<'_>,
        traceparent: Vec<(String, String)>,
        mut on_token: F,
        limits: &mut ProviderLimits,
    ) -> Result<Completion, LlmError>
    where
        F: FnMut(String) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let response = self.send(req, traceparent, limits).await?;
        let streamed = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"));
        if !streamed {
            let completion = self.redacted(self.whole(response).await?);
            if !completion.content.is_empty() {
                on_token(completion.content.clone()).await;
            }
            return Ok(completion);
        }
        let mut builder = CompletionBuilder::default();
        // Tokens go out redacted; a token that may begin a secret waits for the next one.
        let mut tokens = self.redactor.stream();
        let mut events = self.bounded_body(response).eventsource();
        let mut done = false;
        while let Some(event) = events.next().await {
            let event = event.map_err(|e| self.stream_failure(e))?;
            match classify_stream_data(&event.data) {
                StreamItem::Done => {
                    done = true;
                    break;
                }
                StreamItem::Chunk(chunk) => {
                    if let Some(token) = builder.push(chunk).and_then(|t| tokens.push(&t)) {
                        on_token(token).await;
                    }
                }
                StreamItem::Error(error) if error.is_retryable() => {
                    let message = self.scrub(&error.describe());
                    return Err(LlmError::Retryable { status: None, retry_after: None, message });
                }
                StreamItem::Error(error) => {
                    return Err(LlmError::Permanent { status: None, message: self.scrub(&error.describe()) })
                }
                StreamItem::Ignored => {}
            }
        }
        // What is held goes out only with a finished answer: a failed call's held tail may be a
        // secret's head.
        if done || builder.finished() {
            if let Some(rest) = tokens.finish() {
                on_token(rest).await;
            }
            return Ok(self.redacted(builder.finish()));
        }
        Err(LlmError::Retryable {
            status: None,
            retry_after: None,
            message: "LLM stream ended without a finish_reason or [DONE]".into(),
        })
    }

    /// Sends the request; a non-success status is the error it means for the turn.
    async fn send(
        &self,
        req: ChatRequest<'_>,
        traceparent: Vec<(String, String)>,
        limits: &mut ProviderLimits,
    ) -> Result<reqwest::Response, LlmError> {
        let Some(base) = &self.base_url else {
            return Err(LlmError::Permanent { status: None, message: "no LLM configured (FLEET_LLM_BASE_URL)".into() });
        };
        let mut body = json!({
            "model": req.model,
            "messages": req.messages,
            "max_tokens": req.max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(t) = req.temperature {
            body["temperature"] = json!(t);
        }
        if !req.tools.is_empty() {
            body["tools"] = Value::Array(req.tools);
        }
        if let Some(format) = req.response_format {
            body["response_format"] = format;
        }
        let mut request = self.http.post(format!("{base}/chat/completions")).json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        for (k, v) in traceparent {
            request = request.header(k, v);
        }
        let response = request.send().await.map_err(|e| self.network(e))?;
        let status = response.status().as_u16();
        if (300..400).contains(&status) {
            let location = response.headers().get(reqwest::header::LOCATION).and_then(|v| v.to_str().ok());
            return Err(LlmError::Permanent {
                status: Some(status),
                message: self.scrub(&redirect_message(status, location)),
            });
        }
        *limits = ProviderLimits::from_headers(|name| response.headers().get(name).and_then(|v| v.to_str().ok()));
        let retry_after =
            response.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).map(str::to_string);
        match classify_status(status, retry_after.as_deref(), fleet_platform::now_ms() / 1000) {
            ResponseClass::Success | ResponseClass::Accepted => Ok(response),
            ResponseClass::Retryable { retry_after } => {
                let message = self.error_message(status, response).await;
                Err(LlmError::Retryable { status: Some(status), retry_after, message })
            }
            ResponseClass::Permanent => {
                let message = self.error_message(status, response).await;
                Err(LlmError::Permanent { status: Some(status), message })
            }
        }
    }

    /// The response body as a byte stream that fails once it passes `max_response_bytes`.
    fn bounded_body(
        &self,
        response: reqwest::Response,
    ) -> impl futures::Stream<Item = Result<bytes::Bytes, BodyFailure>> {
        let limit = self.max_response_bytes;
        let mut read = 0usize;
        response.bytes_stream().map(move |chunk| {
            let chunk = chunk.map_err(BodyFailure::Network)?;
            read += chunk.len();
            if read > limit {
                return Err(BodyFailure::TooLarge(limit));
            }
            Ok(chunk)
        })
    }

    /// A non-streamed `chat.completion`, read within the same bound.
    async fn whole(&self, response: reqwest::Response) -> Result<Completion, LlmError> {
        let mut body = Vec::new();
        let mut chunks = std::pin::pin!(self.bounded_body(response));
        while let Some(chunk) = chunks.next().await {
            body.extend_from_slice(&chunk.map_err(|e| self.stream_failure(EventStreamError::Transport(e)))?);
        }
        let value: Value = serde_json::from_slice(&body).map_err(|e| LlmError::Retryable {
            status: None,
            retry_after: None,
            message: self.scrub(&format!("LLM response is not JSON: {e}")),
        })?;
        Ok(CompletionBuilder::from_response(&value))
    }

    fn stream_failure(&self, e: EventStreamError<BodyFailure>) -> LlmError {
        let message = match e {
            EventStreamError::Transport(BodyFailure::Network(e)) => return self.network(e),
            EventStreamError::Transport(BodyFailure::TooLarge(limit)) => format!(
                "LLM response exceeded FLEET_LLM_MAX_RESPONSE_BYTES ({limit} bytes); the model may be repeating itself"
            ),
            EventStreamError::Utf8(e) => format!("LLM stream is not UTF-8: {e}"),
            EventStreamError::Parser(e) => format!("LLM stream is not a valid event stream: {e}"),
        };
        LlmError::Retryable { status: None, retry_after: None, message: self.scrub(&message) }
    }

    /// A transport error, without the request URL: it may carry credentials or a query-string key.
    fn network(&self, e: reqwest::Error) -> LlmError {
        let what = if e.is_timeout() { "timed out" } else { "request failed" };
        let e = e.without_url();
        let mut message = format!("LLM {what}: {e}");
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        LlmError::Retryable { status: None, retry_after: None, message: self.scrub(&message) }
    }

    /// What a non-success answer says, from the first [`ERROR_BODY_LIMIT`] bytes of its body,
    /// redacted before it is cut short (a cut could leave a secret's head) and sanitised: a
    /// provider's error may echo its key, a URL with a key in it, or a stack trace.
    async fn error_message(&self, status: u16, response: reqwest::Response) -> String {
        let mut body = Vec::new();
        let mut chunks = response.bytes_stream();
        while let Some(Ok(chunk)) = chunks.next().await {
            let room = ERROR_BODY_LIMIT - body.len();
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if body.len() >= ERROR_BODY_LIMIT {
                break;
            }
        }
        let text = String::from_utf8_lossy(&body);
        let text: String = self.redactor.redact(&text).chars().take(300).collect();
        sanitize_error(&format!("LLM answered HTTP {status}: {text}"))
    }

    /// A completion as the fleet may keep it: its text, its reasoning and its tool calls' arguments
    /// redacted (a secret inside a JSON string is replaced by text that keeps the JSON whole).
    fn redacted(&self, mut completion: Completion) -> Completion {
        for text in [&mut completion.content, &mut completion.reasoning] {
            if let std::borrow::Cow::Owned(clean) = self.redactor.redact(text) {
                *text = clean;
            }
        }
        for call in &mut completion.tool_calls {
            if let std::borrow::Cow::Owned(clean) = self.redactor.redact(&call.arguments) {
                call.arguments = clean;
            }
        }
        completion
    }
}

/// Why a 3xx ends the call: the worker follows no redirect (it would re-send the conversation and
/// the key to an address nobody configured), so the provider's endpoint is misconfigured.
fn redirect_message(status: u16, location: Option<&str>) -> String {
    let to = location.map(|l| format!(" to {l}")).unwrap_or_default();
    format!("LLM answered HTTP {status}, a redirect{to}, which is not followed: configure the provider's final URL")
}

/// The most of an error answer's body the worker reads: enough for the provider's message, and a
/// body that never ends (or is huge) costs nothing more.
pub const ERROR_BODY_LIMIT: usize = 16 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redirect_is_named_with_its_target() {
        let message = redirect_message(307, Some("https://elsewhere.example/v1/chat/completions"));
        assert_eq!(
            message,
            "LLM answered HTTP 307, a redirect to https://elsewhere.example/v1/chat/completions, which is not \
             followed: configure the provider's final URL"
        );
        assert!(redirect_message(301, None).starts_with("LLM answered HTTP 301, a redirect, which is not followed"));
    }
}
