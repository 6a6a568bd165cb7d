//! Reading a session's SSE stream frame by frame (for tests that open many streams, drop them or
//! watch them end), and counting the commands a Redis server has processed.

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

use crate::Fleet;

/// One event frame as sent: its id, event name and JSON data.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub id: String,
    pub event: String,
    pub data: Value,
}

/// What the next read of a stream gave.
#[derive(Debug)]
pub enum Next {
    Frame(Frame),
    /// The server ended the body cleanly.
    End,
    /// The connection failed (reset, cut) before the body ended.
    Broken(String),
}

/// An open SSE response, parsed into frames (comments such as keep-alives are skipped).
pub struct SseReader {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: String,
}

impl SseReader {
    pub fn new(resp: reqwest::Response) -> Self {
        SseReader { body: resp.bytes_stream().boxed(), buf: String::new() }
    }

    /// The next frame, the end of the body, or a broken connection; panics after `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Next {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let raw: String = self.buf.drain(..end + 2).collect();
                if let Some(frame) = parse_frame(&raw) {
                    return Next::Frame(frame);
                }
            }
            match tokio::time::timeout_at(deadline, self.body.next()).await {
                Err(_) => panic!("no SSE frame within {timeout:?}"),
                Ok(None) => return Next::End,
                Ok(Some(Err(e))) => return Next::Broken(e.to_string()),
                Ok(Some(Ok(chunk))) => self.buf.push_str(&String::from_utf8_lossy(&chunk)),
            }
        }
    }

    /// Waits for the stream's first bytes (the dispatcher sends a comment once the stream is set up).
    pub async fn opened(&mut self, timeout: Duration) {
        if !self.buf.is_empty() {
            return;
        }
        match tokio::time::timeout(timeout, self.body.next()).await {
            Ok(Some(Ok(chunk))) => self.buf.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(other) => panic!("the stream ended before sending anything: {other:?}"),
            Err(_) => panic!("the stream sent nothing within {timeout:?}"),
        }
    }

    /// Frames until (and including) the first `done`; panics if the stream ends before.
    pub async fn until_done(&mut self, timeout: Duration) -> Vec<Frame> {
        let mut frames = Vec::new();
        loop {
            match self.next(timeout).await {
                Next::Frame(f) => {
                    let done = f.event == "done";
                    frames.push(f);
                    if done {
                        return frames;
                    }
                }
                other => panic!("the stream stopped before `done`: {other:?} after {frames:?}"),
            }
        }
    }
}

/// An event frame's fields; `None` for a comment-only frame.
pub fn parse_frame(raw: &str) -> Option<Frame> {
    let (mut id, mut event, mut data) = (None, None, None);
    for line in raw.lines() {
        if let Some(v) = line.strip_prefix("id: ") {
            id = Some(v.to_string());
        } else if let Some(v) = line.strip_prefix("event: ") {
            event = Some(v.to_string());
        } else if let Some(v) = line.strip_prefix("data: ") {
            data = Some(serde_json::from_str(v).expect("event data is JSON"));
        }
    }
    Some(Frame { id: id?, event: event?, data: data? })
}

/// Opens `GET /v1/sessions/{session}/stream{query}` with the fleet's bearer token (unless the query
/// carries a stream token) and the given extra headers; returns the response, whatever its status.
pub async fn open_stream(
    http: &reqwest::Client,
    fleet: &Fleet,
    session: &str,
    query: &str,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = http.get(format!("{}/v1/sessions/{session}/stream{query}", fleet.api));
    if !query.contains("token=") {
        req = req.bearer_auth(&fleet.token);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("stream request")
}

/// `POST /v1/sessions/{session}/stream-token`: the token.
pub async fn stream_token(fleet: &Fleet, session: &str) -> String {
    let (status, body) = fleet.post(&format!("/v1/sessions/{session}/stream-token"), &serde_json::json!({})).await;
    assert_eq!(status, 200, "{body}");
    body["data"]["token"].as_str().expect("a token").to_string()
}

/// `INFO stats` `total_commands_processed` of the Redis server at `url`.
pub async fn commands_processed(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut con = crate::redis_connection(&client).await;
    let info: String = redis::cmd("INFO").arg("stats").query_async(&mut con).await.unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_commands_processed in INFO stats")
}

/// Commands per second the server at `url` processes over `window` (the two INFO calls excluded).
pub async fn commands_per_second(url: &str, window: Duration) -> f64 {
    let before = commands_processed(url).await;
    tokio::time::sleep(window).await;
    let after = commands_processed(url).await;
    after.saturating_sub(before + 1) as f64 / window.as_secs_f64()
}
