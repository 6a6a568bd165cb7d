//! The LLM client: any OpenAI-compatible `/chat/completions`, streamed (SSE chunks, with
//! `delta.tool_calls` fragments assembled into whole calls), with a non-streaming fallback when the
//! server answers with a plain JSON completion.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use fleet_protocol::classify::{classify_status, ResponseClass};
use fleet_protocol::turn::{Completion, CompletionBuilder};

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

#[derive(Clone)]
pub struct LlmClient {
    http: reqwest::Client,
    base_url: Option<String>,
    api_key: Option<String>,
}

/// One model call's request.
pub struct ChatRequest<'a> {
    pub model: &'a str,
    pub temperature: Option<f64>,
    pub messages: Vec<Value>,
    pub tools: Vec<Value>,
}

impl LlmClient {
    pub fn new(base_url: Option<String>, api_key: Option<String>, timeout: Duration) -> Self {
        // Proxy variables are ignored, as for callbacks: the model is reached directly.
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .build()
            .expect("the LLM HTTP client builds");
        LlmClient { http, base_url: base_url.map(|u| u.trim_end_matches('/').to_string()), api_key }
    }

    /// Calls the model, handing every content token to `on_token` as it streams in.
    pub async fn complete<F, Fut>(
        &self,
        req: ChatRequest<'_>,
        traceparent: Vec<(String, String)>,
        mut on_token: F,
    ) -> Result<Completion, LlmError>
    where
        F: FnMut(String) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let Some(base) = &self.base_url else {
            return Err(LlmError::Permanent { status: None, message: "no LLM configured (FLEET_LLM_BASE_URL)".into() });
        };
        let mut body = json!({
            "model": req.model,
            "messages": req.messages,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(t) = req.temperature {
            body["temperature"] = json!(t);
        }
        if !req.tools.is_empty() {
            body["tools"] = Value::Array(req.tools);
        }
        let mut request = self.http.post(format!("{base}/chat/completions")).json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        for (k, v) in traceparent {
            request = request.header(k, v);
        }
        let response = request.send().await.map_err(network)?;
        let status = response.status().as_u16();
        let retry_after =
            response.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).map(str::to_string);
        match classify_status(status, retry_after.as_deref(), fleet_platform::now_ms() / 1000) {
            ResponseClass::Success | ResponseClass::Accepted => {}
            ResponseClass::Retryable { retry_after } => {
                let text = response.text().await.unwrap_or_default();
                return Err(LlmError::Retryable {
                    status: Some(status),
                    retry_after,
                    message: format!("LLM answered HTTP {status}: {}", excerpt(&text)),
                });
            }
            ResponseClass::Permanent => {
                let text = response.text().await.unwrap_or_default();
                return Err(LlmError::Permanent {
                    status: Some(status),
                    message: format!("LLM answered HTTP {status}: {}", excerpt(&text)),
                });
            }
        }
        let streamed = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"));
        if !streamed {
            let value: Value = response.json().await.map_err(|e| LlmError::Retryable {
                status: Some(status),
                retry_after: None,
                message: format!("LLM response is not JSON: {e}"),
            })?;
            let completion = CompletionBuilder::from_response(&value);
            if !completion.content.is_empty() {
                on_token(completion.content.clone()).await;
            }
            return Ok(completion);
        }
        let mut builder = CompletionBuilder::default();
        let mut bytes = response.bytes_stream();
        let mut pending = String::new();
        while let Some(chunk) = bytes.next().await {
            let chunk = chunk.map_err(network)?;
            pending.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = pending.find('\n') {
                let line: String = pending.drain(..=end).collect();
                let Some(data) = line.trim().strip_prefix("data:").map(str::trim) else { continue };
                if data == "[DONE]" {
                    return Ok(builder.finish());
                }
                let Ok(value) = serde_json::from_str::<Value>(data) else { continue };
                if let Some(token) = builder.push_chunk(&value) {
                    on_token(token).await;
                }
            }
        }
        Ok(builder.finish())
    }
}

fn network(e: reqwest::Error) -> LlmError {
    let what = if e.is_timeout() { "timed out" } else { "request failed" };
    LlmError::Retryable { status: None, retry_after: None, message: format!("LLM {what}: {e}") }
}

fn excerpt(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(200).collect()
}
