//! A session's event stream in Redis: each event is appended to the session's bounded stream and
//! announced on one Pub/Sub channel (the message is the session id), in one script so that no
//! event goes unannounced. A dispatcher subscribes once and reads a session's stream only when an
//! announcement names it: idle streams cost Redis nothing.
//!
//! Classic Pub/Sub is broadcast to every node of a Redis Cluster, so the subscriber may connect to
//! any of them; the script touches one key only (the stream), as the cluster requires.

use crate::store::script::Lua;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

use super::Sessions;
use crate::store::StoreError;

static PUBLISH_SCRIPT: Lua = Lua::new(|| crate::store::script::load(&[PUBLISH_LUA]));

/// Events each session's stream keeps (approximately: `MAXLEN ~`), and for how long after the last.
const EVENTS_KEPT: u32 = 1000;
const EVENTS_TTL_SECS: u64 = 24 * 3600;

/// Appends each of `ARGV[E+5..]` to the stream `KEYS[K]` in order (`ARGV[E+1]`: entries kept,
/// `ARGV[E+2]`: ttl) and announces the session `ARGV[E+4]` on `ARGV[E+3]` once; returns their ids.
/// `K` and `E` say where its key and arguments start, after any a fragment before it takes.
pub(super) const PUBLISH_MANY_LUA: &str = include_str!("lua/publish_many.lua");

static PUBLISH_MANY_SCRIPT: Lua =
    Lua::new(|| crate::store::script::load(&[include_str!("lua/publish_many_alone.lua"), PUBLISH_MANY_LUA]));
// The message log's four arguments and three keys (all in the session's slot) come first.
static LOG_AND_PUBLISH_SCRIPT: Lua = Lua::new(|| {
    crate::store::script::load(&[
        super::message_log::LOG_ONCE_LUA,
        include_str!("lua/publish_many_logged.lua"),
        PUBLISH_MANY_LUA,
    ])
});

/// How often an idle subscription checks that its connection is alive (one PING per process).
const SUBSCRIPTION_PING: Duration = Duration::from_secs(30);

/// Appends `ARGV[2]` to the stream `KEYS[1]` and announces the session `ARGV[5]` on `ARGV[4]`.
const PUBLISH_LUA: &str = include_str!("lua/publish.lua");

impl Sessions {
    /// Appends a streaming event to the session's bounded event stream and announces it; returns
    /// the event's id.
    pub async fn publish_event(&self, session_id: &str, event: &Value) -> Result<String, StoreError> {
        let r: Result<String, _> = PUBLISH_SCRIPT
            .key(self.redis.keys().session(session_id, "events"))
            .arg(EVENTS_KEPT)
            .arg(event.to_string())
            .arg(EVENTS_TTL_SECS)
            .arg(self.redis.keys().session_events_channel())
            .arg(session_id)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r)
    }

    /// Appends `events` to the session's stream in order, each its own entry with its own id, and
    /// announces them once: one round trip for a run of tokens that arrived together.
    pub async fn publish_events(&self, session_id: &str, events: &[Value]) -> Result<Vec<String>, StoreError> {
        let mut invocation = PUBLISH_MANY_SCRIPT.prepare_invoke();
        self.publish_to(&mut invocation, session_id, events);
        let r: Result<Vec<String>, _> = invocation.invoke_async(&mut self.redis.conn().await?).await;
        self.redis.count(r)
    }

    /// Adds `publish_many.lua`'s key and arguments after whatever `invocation` holds: the
    /// session's stream, what it keeps and for how long, the channel and the session announced,
    /// then the events.
    pub(super) fn publish_to(&self, invocation: &mut redis::ScriptInvocation<'_>, session_id: &str, events: &[Value]) {
        invocation.key(self.redis.keys().session(session_id, "events"));
        invocation
            .arg(EVENTS_KEPT)
            .arg(EVENTS_TTL_SECS)
            .arg(self.redis.keys().session_events_channel())
            .arg(session_id);
        for event in events {
            invocation.arg(event.to_string());
        }
    }

    /// Appends `entry` to the session's message log (once per message id), then `events` to its
    /// stream, announced once: one round trip, and no reader hears of the events before the log
    /// has the message.
    pub async fn log_and_publish(
        &self,
        session_id: &str,
        entry: &fleet_protocol::history::HistoryEntry,
        events: &[Value],
    ) -> Result<Vec<String>, StoreError> {
        let mut invocation = self.log_invocation(&LOG_AND_PUBLISH_SCRIPT, session_id, entry);
        self.publish_to(&mut invocation, session_id, events);
        let r: Result<Vec<String>, _> = invocation.invoke_async(&mut self.redis.conn().await?).await;
        self.redis.count(r)
    }

    /// The id of the newest event in the session's stream (`0-0` if none): where a new reader starts.
    pub async fn last_event_id(&self, session_id: &str) -> Result<String, StoreError> {
        let r: Result<redis::Value, _> = redis::cmd("XREVRANGE")
            .arg(self.redis.keys().session(session_id, "events"))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut self.redis.conn().await?)
            .await;
        let reply: redis::streams::StreamRangeReply = redis::from_redis_value(self.redis.count(r)?).unwrap_or_default();
        Ok(reply.ids.first().map(|e| e.id.clone()).unwrap_or_else(|| "0-0".into()))
    }

    /// Up to `count` events after `after` (a stream id). Never blocks: the connection is shared; a
    /// reader waits for the session's notification (`crate::session_events`) instead.
    pub async fn read_events(
        &self,
        session_id: &str,
        after: &str,
        count: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let key = self.redis.keys().session(session_id, "events");
        let r: Result<redis::Value, _> = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(count)
            .arg("STREAMS")
            .arg(&key)
            .arg(after)
            .query_async(&mut self.redis.conn().await?)
            .await;
        let reply: Option<redis::streams::StreamReadReply> = match self.redis.count(r)? {
            redis::Value::Nil => None,
            v => redis::from_redis_value(v).ok(),
        };
        Ok(reply
            .into_iter()
            .flat_map(|r| r.keys)
            .flat_map(|k| k.ids)
            .map(|entry| {
                let data = entry.get::<String>("data").unwrap_or_default();
                (entry.id, data)
            })
            .collect())
    }

    /// The event the session's stream keeps under `id` (a stream id), if it still keeps it.
    pub async fn read_event(&self, session_id: &str, id: &str) -> Result<Option<Value>, StoreError> {
        let r: Result<redis::Value, _> = redis::cmd("XRANGE")
            .arg(self.redis.keys().session(session_id, "events"))
            .arg(id)
            .arg(id)
            .query_async(&mut self.redis.conn().await?)
            .await;
        let reply: redis::streams::StreamRangeReply = redis::from_redis_value(self.redis.count(r)?).unwrap_or_default();
        Ok(reply.ids.first().and_then(|e| e.get::<String>("data")).and_then(|data| serde_json::from_str(&data).ok()))
    }

    /// Removes an event a request appended before it failed (its job was never accepted).
    pub async fn delete_event(&self, session_id: &str, id: &str) -> Result<(), StoreError> {
        let r: Result<i64, _> = redis::cmd("XDEL")
            .arg(self.redis.keys().session(session_id, "events"))
            .arg(id)
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r).map(|_| ())
    }

    /// Subscribes to the announcements of appended session events, on a connection of its own
    /// (the first node that answers, for a cluster).
    pub async fn subscribe_session_events(&self) -> Result<SessionEventSubscription, StoreError> {
        let channel = self.redis.keys().session_events_channel();
        let mut last_error = None;
        for url in self.redis.nodes.iter() {
            let attempt = async {
                let mut pubsub = redis::Client::open(crate::store::sends_at_once(url)?)?.get_async_pubsub().await?;
                pubsub.subscribe(&channel).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            match tokio::time::timeout(self.redis.timeout, attempt).await {
                Ok(Ok(pubsub)) => {
                    let (sink, stream) = pubsub.split();
                    return Ok(SessionEventSubscription { sink, stream, timeout: self.redis.timeout });
                }
                Ok(Err(e)) => last_error = Some(e),
                Err(_) => {
                    last_error = Some(redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))
                }
            }
        }
        let e = last_error.unwrap_or_else(|| redis::RedisError::from(std::io::Error::other("no Redis URL")));
        self.redis.count(Err(e))
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
