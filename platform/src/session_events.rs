//! A session's event stream in Redis: each event is appended to the session's bounded stream and
//! announced on one Pub/Sub channel (the message is the session id), in one script so that no
//! event goes unannounced. A dispatcher subscribes once and reads a session's stream only when an
//! announcement names it: idle streams cost Redis nothing.
//!
//! Classic Pub/Sub is broadcast to every node of a Redis Cluster, so the subscriber may connect to
//! any of them; the script touches one key only (the stream), as the cluster requires.

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

use crate::store::{Store, StoreError};

// Built once: `Script::new` hashes its source.
static PUBLISH_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(PUBLISH_LUA));

/// Events each session's stream keeps (approximately: `MAXLEN ~`), and for how long after the last.
const EVENTS_KEPT: u32 = 1000;
const EVENTS_TTL_SECS: u64 = 24 * 3600;

/// How often an idle subscription checks that its connection is alive (one PING per process).
const SUBSCRIPTION_PING: Duration = Duration::from_secs(30);

/// Appends `ARGV[2]` to the stream `KEYS[1]` and announces the session `ARGV[5]` on `ARGV[4]`.
const PUBLISH_LUA: &str = r#"
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'data', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return id
"#;

impl Store {
    /// Appends a streaming event to the session's bounded event stream and announces it; returns
    /// the event's id.
    pub async fn publish_event(&self, session_id: &str, event: &Value) -> Result<String, StoreError> {
        let r: Result<String, _> = PUBLISH_SCRIPT
            .key(self.keys().session(session_id, "events"))
            .arg(EVENTS_KEPT)
            .arg(event.to_string())
            .arg(EVENTS_TTL_SECS)
            .arg(self.keys().session_events_channel())
            .arg(session_id)
            .invoke_async(&mut self.conn().await?)
            .await;
        self.count(r)
    }

    /// Subscribes to the announcements of appended session events, on a connection of its own
    /// (the first node that answers, for a cluster).
    pub async fn subscribe_session_events(&self) -> Result<SessionEventSubscription, StoreError> {
        let channel = self.keys().session_events_channel();
        let mut last_error = None;
        for url in self.nodes.iter() {
            let attempt = async {
                let mut pubsub = redis::Client::open(url.as_str())?.get_async_pubsub().await?;
                pubsub.subscribe(&channel).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            match tokio::time::timeout(self.timeout, attempt).await {
                Ok(Ok(pubsub)) => {
                    let (sink, stream) = pubsub.split();
                    return Ok(SessionEventSubscription { sink, stream, timeout: self.timeout });
                }
                Ok(Err(e)) => last_error = Some(e),
                Err(_) => {
                    last_error = Some(redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))
                }
            }
        }
        let e = last_error.unwrap_or_else(|| redis::RedisError::from(std::io::Error::other("no Redis URL")));
        self.count(Err(e))
    }
}

/// A live subscription to session-event announcements.
pub struct SessionEventSubscription {
    sink: redis::aio::PubSubSink,
    stream: redis::aio::PubSubStream,
    timeout: Duration,
}

impl SessionEventSubscription {
    /// The next announced session id; `None` once the connection is lost (closed, or a PING went
    /// unanswered), after which announcements may have been missed.
    pub async fn next(&mut self) -> Option<String> {
        let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + SUBSCRIPTION_PING, SUBSCRIPTION_PING);
        loop {
            tokio::select! {
                msg = self.stream.next() => {
                    match msg?.get_payload::<String>() {
                        Ok(session_id) => return Some(session_id),
                        Err(e) => tracing::warn!(error = %e, "unreadable session-event announcement"),
                    }
                }
                _ = ping.tick() => {
                    let pong = tokio::time::timeout(self.timeout, self.sink.ping::<redis::Value>()).await;
                    if !matches!(pong, Ok(Ok(_))) {
                        return None;
                    }
                }
            }
        }
    }
}
