//! A small OpenAI-compatible chat-completions server for tests: it streams SSE chunks (reasoning
//! and content tokens, `delta.tool_calls` fragments, usage), or answers with a status, as each test scripts it,
//! and records every request with its start and end time.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

/// What the model answers.
#[derive(Debug, Clone)]
pub enum LlmReply {
    /// Streamed text, one chunk per token, `delay` between chunks.
    Text { tokens: Vec<String>, delay: Duration },
    /// Streamed tool calls: (id, name, arguments JSON); arguments arrive in two fragments. An empty
    /// id is not sent.
    ToolCalls(Vec<(String, String, String)>),
    /// An error status.
    Status(u16),
    /// An error status with this body.
    StatusBody(u16, String),
    /// A redirect: this 3xx status with `Location` set to the URL.
    Redirect(u16, String),
    /// An error status whose body never ends: 64 KiB at a time until the client hangs up (the
    /// bytes written are counted, `MockLlm::error_bytes_sent`).
    EndlessError(u16),
    /// A non-streamed `chat.completion` with this text.
    Whole(String),
    /// An event stream written byte for byte as given, one network write per piece, 30 ms apart
    /// (so a piece boundary can fall inside a UTF-8 character or an SSE line).
    Raw(Vec<Vec<u8>>),
    /// A model that never stops: a token every millisecond until the client hangs up.
    Runaway,
    /// `reply`, after the model thought for the given time.
    After(Duration, Box<LlmReply>),
    /// `reply` with these response headers (`Retry-After`, `x-ratelimit-*`).
    Headers(Vec<(String, String)>, Box<LlmReply>),
    /// A reasoning model: `reasoning` streamed first, one chunk per piece, under the delta field
    /// `field` (`reasoning_content`, as DeepSeek and vLLM name it, or `reasoning`, as OpenRouter
    /// and Ollama do), then `then` (`Text` or `ToolCalls`; a `Whole` answer carries it whole).
    Reasoning { field: &'static str, reasoning: Vec<String>, then: Box<LlmReply> },
}

impl LlmReply {
    pub fn text(t: &str) -> Self {
        LlmReply::Text { tokens: t.split_inclusive(' ').map(str::to_string).collect(), delay: Duration::ZERO }
    }
    /// This reply after the model reasoned `reasoning` (in pieces), under `reasoning_content`.
    pub fn reasoning(reasoning: &[&str], then: LlmReply) -> Self {
        let reasoning = reasoning.iter().map(|r| r.to_string()).collect();
        LlmReply::Reasoning { field: "reasoning_content", reasoning, then: Box::new(then) }
    }
    /// The same reasoning reply with its reasoning under the delta field `field` instead.
    pub fn reasoning_as(self, field: &'static str) -> Self {
        match self {
            LlmReply::Reasoning { reasoning, then, .. } => LlmReply::Reasoning { field, reasoning, then },
            other => other,
        }
    }
    /// This reply, sent after `delay`.
    pub fn after(self, delay: Duration) -> Self {
        LlmReply::After(delay, Box::new(self))
    }
    /// This reply with a response header.
    pub fn header(self, name: &str, value: &str) -> Self {
        LlmReply::Headers(vec![(name.to_string(), value.to_string())], Box::new(self))
    }
}

#[derive(Debug, Clone)]
pub struct LlmRequest {
    pub body: Value,
    pub started: Instant,
    pub ended: Option<Instant>,
    pub authorization: Option<String>,
    pub traceparent: Option<String>,
}

impl LlmRequest {
    /// Every message's content, for finding a marker in the conversation.
    pub fn contents(&self) -> Vec<String> {
        self.body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["content"].as_str().map(str::to_string))
            .collect()
    }
    pub fn messages(&self) -> Vec<Value> {
        self.body["messages"].as_array().cloned().unwrap_or_default()
    }
}

type Script = Arc<dyn Fn(&Value, usize) -> LlmReply + Send + Sync>;

struct Inner {
    script: Script,
    requests: Mutex<Vec<LlmRequest>>,
    error_bytes: std::sync::atomic::AtomicU64,
}

#[derive(Clone)]
pub struct MockLlm {
    inner: Arc<Inner>,
    pub addr: SocketAddr,
}

impl MockLlm {
    /// Starts the server; `script` gets the request body and how many requests came before it.
    pub async fn start(script: impl Fn(&Value, usize) -> LlmReply + Send + Sync + 'static) -> Self {
        Self::start_on("127.0.0.1:0", script).await
    }

    /// Starts the server on `addr`.
    pub async fn start_on(addr: &str, script: impl Fn(&Value, usize) -> LlmReply + Send + Sync + 'static) -> Self {
        let inner = Arc::new(Inner {
            script: Arc::new(script),
            requests: Mutex::new(vec![]),
            error_bytes: std::sync::atomic::AtomicU64::new(0),
        });
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app =
            axum::Router::new().route("/v1/chat/completions", axum::routing::post(complete)).with_state(inner.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        MockLlm { inner, addr }
    }

    /// The `FLEET_LLM_BASE_URL` for this server.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn requests(&self) -> Vec<LlmRequest> {
        self.inner.requests.lock().unwrap().clone()
    }

    /// Bytes of `EndlessError` bodies written so far (a client that stops reading holds this still).
    pub fn error_bytes_sent(&self) -> u64 {
        self.inner.error_bytes.load(std::sync::atomic::Ordering::SeqCst)
    }
}

async fn complete(
    State(inner): State<Arc<Inner>>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let index = {
        let mut all = inner.requests.lock().unwrap();
        all.push(LlmRequest {
            body: body.clone(),
            started: Instant::now(),
            ended: None,
            authorization: headers.get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string),
            traceparent: headers.get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_string),
        });
        all.len() - 1
    };
    let mut reply = (inner.script)(&body, index);
    let mut extra = vec![];
    let reply = loop {
        reply = match reply {
            LlmReply::After(delay, then) => {
                tokio::time::sleep(delay).await;
                *then
            }
            LlmReply::Headers(headers, then) => {
                extra.extend(headers);
                *then
            }
            other => break other,
        }
    };
    let mut response = answer(inner, index, reply);
    for (name, value) in extra {
        response.headers_mut().insert(
            axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            axum::http::HeaderValue::from_str(&value).unwrap(),
        );
    }
    response
}

fn answer(inner: Arc<Inner>, index: usize, reply: LlmReply) -> Response {
    // A reasoning model's reasoning goes before whatever its answer is (not sent with a raw stream,
    // an error or a runaway, which script their bytes themselves).
    let (thought, reply) = match reply {
        LlmReply::Reasoning { field, reasoning, then } => (Some((field, reasoning)), *then),
        other => (None, other),
    };
    let finish = {
        let inner = inner.clone();
        move || inner.requests.lock().unwrap()[index].ended = Some(Instant::now())
    };
    if let LlmReply::Raw(pieces) = &reply {
        return raw_stream(pieces.clone(), finish);
    }
    if let LlmReply::Runaway = &reply {
        return runaway_stream();
    }
    if let LlmReply::EndlessError(code) = &reply {
        return endless_error(*code, inner.clone());
    }
    let chunk = |delta: Value, finish_reason: Value| json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]});
    let mut frames: Vec<(Duration, String)> = match reply {
        LlmReply::Status(code) => {
            finish();
            return (StatusCode::from_u16(code).unwrap(), Json(json!({"error": {"message": "scripted failure"}})))
                .into_response();
        }
        LlmReply::StatusBody(code, body) => {
            finish();
            return (StatusCode::from_u16(code).unwrap(), body).into_response();
        }
        LlmReply::Redirect(code, location) => {
            finish();
            return (StatusCode::from_u16(code).unwrap(), [(axum::http::header::LOCATION, location)], "moved")
                .into_response();
        }
        LlmReply::Whole(text) => {
            finish();
            let mut message = json!({"role": "assistant", "content": text});
            if let Some((field, reasoning)) = &thought {
                message[*field] = json!(reasoning.concat());
            }
            return Json(json!({"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})).into_response();
        }
        LlmReply::Raw(_)
        | LlmReply::Runaway
        | LlmReply::EndlessError(_)
        | LlmReply::After(..)
        | LlmReply::Headers(..)
        | LlmReply::Reasoning { .. } => {
            unreachable!("answered above, or not an answer a reasoning reply wraps")
        }
        LlmReply::Text { tokens, delay } => {
            let mut f =
                vec![(Duration::ZERO, chunk(json!({"role": "assistant", "content": ""}), Value::Null).to_string())];
            f.extend(tokens.iter().map(|t| (delay, chunk(json!({"content": t}), Value::Null).to_string())));
            f.push((Duration::ZERO, chunk(json!({}), json!("stop")).to_string()));
            f
        }
        LlmReply::ToolCalls(calls) => {
            let mut f =
                vec![(Duration::ZERO, chunk(json!({"role": "assistant", "content": null}), Value::Null).to_string())];
            for (i, (id, name, args)) in calls.iter().enumerate() {
                let (a, b) = args.split_at(args.len() / 2);
                let mut first =
                    json!({"index": i, "id": id, "type": "function", "function": {"name": name, "arguments": a}});
                // Some OpenAI-compatible servers send no id at all: an empty id is left out.
                if id.is_empty() {
                    first.as_object_mut().unwrap().remove("id");
                }
                f.push((Duration::ZERO, chunk(json!({"tool_calls": [first]}), Value::Null).to_string()));
                f.push((
                    Duration::ZERO,
                    chunk(json!({"tool_calls": [{"index": i, "function": {"arguments": b}}]}), Value::Null).to_string(),
                ));
            }
            f.push((Duration::ZERO, chunk(json!({}), json!("tool_calls")).to_string()));
            f
        }
    };
    // The reasoning comes after the role's chunk and before the answer, as reasoning servers send it.
    if let Some((field, reasoning)) = thought {
        let pieces = reasoning.iter().map(|r| (Duration::ZERO, chunk(json!({field: r}), Value::Null).to_string()));
        frames.splice(1..1, pieces);
    }
    let usage = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 3}});
    let stream = futures::stream::unfold(
        (frames.into_iter(), Some(usage), false, Some(finish)),
        |(mut frames, mut usage, mut done, mut fin)| async move {
            if let Some((delay, data)) = frames.next() {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                return Some((Ok::<_, std::io::Error>(format!("data: {data}\n\n")), (frames, usage, done, fin)));
            }
            if let Some(u) = usage.take() {
                return Some((Ok(format!("data: {u}\n\n")), (frames, usage, done, fin)));
            }
            if !done {
                done = true;
                if let Some(f) = fin.take() {
                    f();
                }
                return Some((Ok("data: [DONE]\n\n".to_string()), (frames, usage, done, fin)));
            }
            None
        },
    );
    ([(axum::http::header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(stream)).into_response()
}

fn raw_stream(pieces: Vec<Vec<u8>>, finish: impl FnOnce() + Send + 'static) -> Response {
    let stream = futures::stream::unfold((pieces.into_iter(), Some(finish)), |(mut pieces, mut fin)| async move {
        match pieces.next() {
            Some(piece) => {
                tokio::time::sleep(Duration::from_millis(30)).await;
                Some((Ok::<_, std::io::Error>(piece), (pieces, fin)))
            }
            None => {
                if let Some(f) = fin.take() {
                    f();
                }
                None
            }
        }
    });
    ([(axum::http::header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(stream)).into_response()
}

fn endless_error(code: u16, inner: Arc<Inner>) -> Response {
    let piece = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
    let stream = futures::stream::unfold((piece, inner), |(piece, inner)| async move {
        tokio::time::sleep(Duration::from_millis(1)).await;
        inner.error_bytes.fetch_add(piece.len() as u64, std::sync::atomic::Ordering::SeqCst);
        Some((Ok::<_, std::io::Error>(piece.clone()), (piece, inner)))
    });
    (StatusCode::from_u16(code).unwrap(), Body::from_stream(stream)).into_response()
}

fn runaway_stream() -> Response {
    let frame = format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "la "}, "finish_reason": null}]})
    );
    let stream = futures::stream::unfold(frame, |frame| async move {
        tokio::time::sleep(Duration::from_millis(1)).await;
        Some((Ok::<_, std::io::Error>(frame.clone()), frame))
    });
    ([(axum::http::header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(stream)).into_response()
}
