//! A model provider that enforces a quota as real ones do, for the budget benchmark: requests and
//! tokens per minute, each a bucket holding one minute's worth and refilling continuously; a call
//! either bucket cannot pay for is answered 429 with `Retry-After`. A call it takes costs its
//! prompt (four bytes of JSON per token, the fleet's own estimate) plus a fixed completion, and is
//! answered at once with a short non-streamed completion reporting that `usage`. A surprise window
//! answers 429 to everything, as a provider whose quota another client spent would. Every request
//! is logged: when it arrived, whether it was taken, and the marker in its last user message.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

/// One request as the provider saw it.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub at: Instant,
    pub taken: bool,
    /// The tokens it cost (0 when refused).
    pub tokens: u64,
    /// The last user message's content.
    pub marker: String,
}

struct Buckets {
    requests: f64,
    tokens: f64,
    at: Instant,
}

struct Inner {
    requests_per_minute: f64,
    tokens_per_minute: f64,
    completion_tokens: u64,
    buckets: Mutex<Buckets>,
    surprise_until: Mutex<Option<Instant>>,
    log: Mutex<Vec<Arrival>>,
}

#[derive(Clone)]
pub struct QuotaLlm {
    inner: Arc<Inner>,
    pub addr: SocketAddr,
}

impl QuotaLlm {
    /// Starts a provider taking `requests_per_minute` and `tokens_per_minute`, each call
    /// answering with `completion_tokens`; both buckets start full.
    pub async fn start(requests_per_minute: u64, tokens_per_minute: u64, completion_tokens: u64) -> Self {
        let inner = Arc::new(Inner {
            requests_per_minute: requests_per_minute as f64,
            tokens_per_minute: tokens_per_minute as f64,
            completion_tokens,
            buckets: Mutex::new(Buckets {
                requests: requests_per_minute as f64,
                tokens: tokens_per_minute as f64,
                at: Instant::now(),
            }),
            surprise_until: Mutex::new(None),
            log: Mutex::new(vec![]),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app =
            axum::Router::new().route("/v1/chat/completions", axum::routing::post(complete)).with_state(inner.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        QuotaLlm { inner, addr }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Answers 429 (`Retry-After: 2`) to everything for `length`, from now.
    pub fn surprise(&self, length: Duration) {
        *self.inner.surprise_until.lock().unwrap() = Some(Instant::now() + length);
    }

    pub fn log(&self) -> Vec<Arrival> {
        self.inner.log.lock().unwrap().clone()
    }
}

/// Whether the buckets can pay `tokens` now (taking them if so), else the seconds until they can.
fn take(inner: &Inner, tokens: f64) -> Result<(), u64> {
    let mut b = inner.buckets.lock().unwrap();
    let now = Instant::now();
    let elapsed = now.duration_since(b.at).as_secs_f64();
    b.requests = (b.requests + elapsed * inner.requests_per_minute / 60.0).min(inner.requests_per_minute);
    b.tokens = (b.tokens + elapsed * inner.tokens_per_minute / 60.0).min(inner.tokens_per_minute);
    b.at = now;
    if b.requests >= 1.0 && b.tokens >= tokens {
        b.requests -= 1.0;
        b.tokens -= tokens;
        return Ok(());
    }
    let wait_requests = (1.0 - b.requests).max(0.0) * 60.0 / inner.requests_per_minute;
    let wait_tokens = (tokens - b.tokens).max(0.0) * 60.0 / inner.tokens_per_minute;
    Err(wait_requests.max(wait_tokens).ceil().max(1.0) as u64)
}

async fn complete(State(inner): State<Arc<Inner>>, Json(body): Json<Value>) -> Response {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let tools = body["tools"].as_array().cloned().unwrap_or_default();
    let prompt = fleet_protocol::budget::estimate_tokens(&messages, &tools, 0);
    let cost = prompt + inner.completion_tokens;
    let marker = messages.iter().rev().find(|m| m["role"] == "user").and_then(|m| m["content"].as_str());
    let mut arrival = Arrival { at: Instant::now(), taken: false, tokens: 0, marker: marker.unwrap_or("").into() };
    let surprised = inner.surprise_until.lock().unwrap().is_some_and(|until| arrival.at < until);
    let refused = if surprised { Err(2) } else { take(&inner, cost as f64) };
    if let Err(retry_after) = refused {
        inner.log.lock().unwrap().push(arrival);
        let error = json!({"error": {"message": "rate limit reached", "type": "rate_limit_exceeded"}});
        return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", retry_after.to_string())], Json(error))
            .into_response();
    }
    arrival.taken = true;
    arrival.tokens = cost;
    inner.log.lock().unwrap().push(arrival);
    Json(json!({
        "id": "chatcmpl-quota",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": inner.completion_tokens},
    }))
    .into_response()
}
