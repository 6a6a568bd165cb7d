//! A small OpenAI-compatible chat-completions server for tests: it streams SSE chunks (content
//! tokens, `delta.tool_calls` fragments, usage), or answers with a status, as each test scripts it,
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
    /// Streamed tool calls: (id, name, arguments JSON); arguments arrive in two fragments.
    ToolCalls(Vec<(String, String, String)>),
    /// An error status.
    Status(u16),
    /// A non-streamed `chat.completion` with this text.
    Whole(String),
    /// An event stream written byte for byte as given, one network write per piece, 30 ms apart
    /// (so a piece boundary can fall inside a UTF-8 character or an SSE line).
    Raw(Vec<Vec<u8>>),
    /// A model that never stops: a token every millisecond until the client hangs up.
    Runaway,
    /// `reply`, after the model thought for the given time.
    After(Duration, Box<LlmReply>),
}

impl LlmReply {
    pub fn text(t: &str) -> Self {
        LlmReply::Text { tokens: t.split_inclusive(' ').map(str::to_string).collect(), delay: Duration::ZERO }
    }
    /// This reply, sent after `delay`.
    pub fn after(self, delay: Duration) -> Self {
        LlmReply::After(delay, Box::new(self))
    }
}

#[derive(Debug, Clone)]
pub struct LlmRequest {
    pub body: Value,
    pub started: Instant,
    pub ended: Option<Instant>,
    pub authorization: Option<String>,
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
        let inner = Arc::new(Inner { script: Arc::new(script), requests: Mutex::new(vec![]) });
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
        });
        all.len() - 1
    };
    let mut reply = (inner.script)(&body, index);
    while let LlmReply::After(delay, then) = reply {
        tokio::time::sleep(delay).await;
        reply = *then;
    }
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
    let chunk = |delta: Value, finish_reason: Value| json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]});
    let frames: Vec<(Duration, String)> = match reply {
        LlmReply::Status(code) => {
            finish();
            return (StatusCode::from_u16(code).unwrap(), Json(json!({"error": {"message": "scripted failure"}})))
                .into_response();
        }
        LlmReply::Whole(text) => {
            finish();
            return Json(json!({"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 5, "completion_tokens": 2}})).into_response();
        }
        LlmReply::Raw(_) | LlmReply::Runaway | LlmReply::After(..) => unreachable!("answered above"),
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
                f.push((Duration::ZERO, chunk(json!({"tool_calls": [{"index": i, "id": id, "type": "function", "function": {"name": name, "arguments": a}}]}), Value::Null).to_string()));
                f.push((
                    Duration::ZERO,
                    chunk(json!({"tool_calls": [{"index": i, "function": {"arguments": b}}]}), Value::Null).to_string(),
                ));
            }
            f.push((Duration::ZERO, chunk(json!({}), json!("tool_calls")).to_string()));
            f
        }
    };
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
