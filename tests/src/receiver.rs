//! A tool owner's callback receiver for tests: records every request, verifies its signature with
//! an independent HMAC and the seed's 300 s window (or a verifier the test gives), counts side
//! effects once per execution id, and answers as the test scripts it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::Value;

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Received {
    pub at: Instant,
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    pub json: Value,
    /// The independent verification's verdict (signature and timestamp window).
    pub verified: Result<(), String>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }
    /// The delivery's execution id: `X-Interactor-Request-Id` or, under Standard Webhooks,
    /// `webhook-id` (for tool callbacks it equals the body's `execution_id`; webhook events carry
    /// theirs only in the header).
    pub fn execution_id(&self) -> &str {
        self.header("x-interactor-request-id")
            .or_else(|| self.header("webhook-id"))
            .or_else(|| self.json["execution_id"].as_str())
            .unwrap_or_default()
    }
}

/// How to answer a request.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub delay: Duration,
    pub headers: Vec<(String, String)>,
}

impl Reply {
    pub fn status(status: u16) -> Self {
        Reply { status, body: String::new(), delay: Duration::ZERO, headers: vec![] }
    }
    /// A 200 with the seed's `{"result": …}` body.
    pub fn result(result: Value) -> Self {
        Reply {
            status: 200,
            body: serde_json::json!({ "result": result }).to_string(),
            delay: Duration::ZERO,
            headers: vec![],
        }
    }
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// Decides the answer from the request and how many requests this execution id sent before it.
pub type Script = Arc<dyn Fn(&Received, usize) -> Reply + Send + Sync>;

/// Verifies a request from its headers (names lower-case) and raw body.
pub type Verifier = Arc<dyn Fn(&HashMap<String, String>, &[u8]) -> Result<(), String> + Send + Sync>;

struct Inner {
    verifier: Verifier,
    script: Script,
    received: Mutex<Vec<Received>>,
    side_effects: Mutex<HashMap<String, u32>>,
    /// Requests being answered right now, and the most there ever were at once.
    in_flight: Mutex<(usize, usize)>,
}

#[derive(Clone)]
pub struct Receiver {
    inner: Arc<Inner>,
    pub addr: SocketAddr,
    _server: Arc<tokio::task::JoinHandle<()>>,
}

impl Receiver {
    /// Starts a receiver on loopback answering with `script`, verifying the seed's signature
    /// under `secret`.
    pub async fn start(secret: &str, script: impl Fn(&Received, usize) -> Reply + Send + Sync + 'static) -> Self {
        let secret = secret.as_bytes().to_vec();
        Self::start_verifying(Arc::new(move |headers, body| verify(&secret, headers, body)), script).await
    }

    /// Starts a receiver on loopback answering with `script`, verifying with `verifier`.
    pub async fn start_verifying(
        verifier: Verifier,
        script: impl Fn(&Received, usize) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let inner = Arc::new(Inner {
            verifier,
            script: Arc::new(script),
            received: Mutex::new(Vec::new()),
            side_effects: Mutex::new(HashMap::new()),
            in_flight: Mutex::new((0, 0)),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().fallback(handle).with_state(inner.clone());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Receiver { inner, addr, _server: Arc::new(server) }
    }

    /// A receiver that answers every call with a result echoing the parameters.
    pub async fn echo(secret: &str) -> Self {
        Self::start(secret, |r, _| Reply::result(serde_json::json!({"echo": r.json["parameters"].clone()}))).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn received(&self) -> Vec<Received> {
        self.inner.received.lock().unwrap().clone()
    }

    pub fn received_for(&self, execution_id: &str) -> Vec<Received> {
        self.received().into_iter().filter(|r| r.execution_id() == execution_id).collect()
    }

    /// How many times the tool's side effect ran for `execution_id` (the receiver is idempotent
    /// by execution id, as the seed requires, so this counts distinct successful deliveries).
    pub fn side_effects(&self, execution_id: &str) -> u32 {
        self.inner.side_effects.lock().unwrap().get(execution_id).copied().unwrap_or(0)
    }

    pub fn total_side_effects(&self) -> u32 {
        self.inner.side_effects.lock().unwrap().values().sum()
    }

    /// The most requests this receiver was answering at the same time.
    pub fn max_concurrent(&self) -> usize {
        self.inner.in_flight.lock().unwrap().1
    }
}

async fn handle(State(inner): State<Arc<Inner>>, uri: axum::http::Uri, headers: HeaderMap, body: Bytes) -> Response {
    let headers: HashMap<String, String> =
        headers.iter().map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or_default().to_string())).collect();
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let verified = (inner.verifier)(&headers, &body);
    let received =
        Received { at: Instant::now(), path: uri.path().to_string(), headers, body: body.to_vec(), json, verified };
    let before = {
        let mut all = inner.received.lock().unwrap();
        let before = all.iter().filter(|r| r.execution_id() == received.execution_id()).count();
        all.push(received.clone());
        before
    };
    let reply = (inner.script)(&received, before);
    {
        let mut n = inner.in_flight.lock().unwrap();
        n.0 += 1;
        n.1 = n.1.max(n.0);
    }
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    // Counted down before the answer leaves, so the count never exceeds what the sender holds.
    inner.in_flight.lock().unwrap().0 -= 1;
    if (200..300).contains(&reply.status) && received.verified.is_ok() {
        let mut effects = inner.side_effects.lock().unwrap();
        let count = effects.entry(received.execution_id().to_string()).or_insert(0);
        // Idempotent by execution id, as the seed tells tool owners to be.
        if *count == 0 {
            *count = 1;
        }
    }
    let mut response = (StatusCode::from_u16(reply.status).unwrap(), reply.body).into_response();
    for (k, v) in reply.headers {
        response.headers_mut().insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            axum::http::HeaderValue::from_str(&v).unwrap(),
        );
    }
    response
}

/// The seed's verification, written independently: HMAC over the raw body and a 300 s window.
pub fn verify(secret: &[u8], headers: &HashMap<String, String>, body: &[u8]) -> Result<(), String> {
    let signature = headers.get("x-interactor-signature").ok_or("no X-Interactor-Signature")?;
    let timestamp = headers.get("x-interactor-timestamp").ok_or("no X-Interactor-Timestamp")?;
    let signed = time::OffsetDateTime::parse(timestamp, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("bad timestamp {timestamp}: {e}"))?;
    let age = (time::OffsetDateTime::now_utc() - signed).whole_seconds().abs();
    if age > 300 {
        return Err(format!("request too old: {age}s"));
    }
    let expected = format!("sha256={}", hex::encode(crate::independent_hmac_sha256(secret, body)));
    if signature.as_bytes() != expected.as_bytes() {
        return Err("invalid signature".into());
    }
    Ok(())
}
