//! One reader per session with listeners, shared by all of them: the process subscribes once to
//! the announcements of appended events (`fleet_platform::session_events`), and an announcement
//! wakes the named session's reader, which reads what is new once and fans it out to every
//! listener through a broadcast channel. No listener polls Redis, and an idle stream costs Redis
//! nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{broadcast, Notify, OnceCell};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use fleet_platform::store::{Store, StoreError};
use fleet_protocol::turn;

use super::request::StreamId;

/// Batches a listener may fall behind before it re-reads from Redis instead.
const BROADCAST_BATCHES: usize = 64;
/// `read_events` returns at most this many at once; a full batch means there may be more.
const READ_BATCH: usize = 100;

/// One event, its SSE frame rendered once for every listener, and its JSON (a seed 001 response
/// shows it its own way).
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) id: StreamId,
    pub(crate) frame: Bytes,
    pub(crate) is_done: bool,
    pub(crate) data: Arc<serde_json::Value>,
}

/// The listeners' shared reader of one session's stream.
struct Feed {
    session_id: String,
    events: broadcast::Sender<Arc<Vec<Event>>>,
    wake: Notify,
    /// Set once the reader runs (its cursor read): listeners wait for it before their own catch-up.
    started: OnceCell<()>,
    stop: CancellationToken,
}

/// Every session feed of this process and the subscription that wakes them.
pub struct StreamHub {
    store: Store,
    /// Feeds by session id, with their listener counts.
    feeds: Mutex<HashMap<String, (Arc<Feed>, usize)>>,
    cancel: CancellationToken,
    tasks: TaskTracker,
}

/// A listener's place on a session's feed; leaving (drop) stops the feed with its last listener.
pub(crate) struct Subscription {
    hub: Arc<StreamHub>,
    feed: Arc<Feed>,
    pub(crate) events: broadcast::Receiver<Arc<Vec<Event>>>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.leave(&self.feed);
    }
}

impl StreamHub {
    /// Starts the announcement subscriber; everything stops when `cancel` fires (open streams
    /// end, so a graceful shutdown is not held up by them).
    pub fn start(store: Store, cancel: CancellationToken) -> Arc<StreamHub> {
        let hub = Arc::new(StreamHub { store, feeds: Mutex::default(), cancel, tasks: TaskTracker::new() });
        hub.tasks.spawn(listen_for_announcements(hub.clone()));
        hub
    }

    /// Runs `task` as one of the hub's own, awaited when the hub stops: what a dropped stream
    /// still owes Redis (its listener's removal) outlives the stream but not the process.
    pub(crate) fn track(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(task);
    }

    /// Fires when the hub stops: a listener ends its stream then.
    pub(crate) fn stopping(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Waits for every task the hub started (after its `cancel` fired).
    pub async fn stopped(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Listens to `session_id`'s events: those appended after this returns are delivered through
    /// the subscription (with some before, which the listener skips by id).
    pub(crate) async fn join(self: &Arc<Self>, session_id: &str) -> Result<Subscription, StoreError> {
        let (feed, events) = {
            let mut feeds = self.feeds.lock().expect("feeds lock");
            let (feed, listeners) = feeds.entry(session_id.to_string()).or_insert_with(|| {
                let feed = Feed {
                    session_id: session_id.to_string(),
                    events: broadcast::channel(BROADCAST_BATCHES).0,
                    wake: Notify::new(),
                    started: OnceCell::new(),
                    stop: self.cancel.child_token(),
                };
                (Arc::new(feed), 0)
            });
            *listeners += 1;
            (feed.clone(), feed.events.subscribe())
        };
        let subscription = Subscription { hub: self.clone(), feed: feed.clone(), events };
        // The feed is registered before its cursor is read, so an event appended after the cursor
        // is announced to a registered feed and wakes its reader.
        feed.started
            .get_or_try_init(|| async {
                let cursor = self.store.sessions().last_event_id(session_id).await?;
                let cursor = StreamId::parse(&cursor).unwrap_or(StreamId::ZERO);
                self.tasks.spawn(read_feed(self.store.clone(), feed.clone(), cursor));
                Ok::<_, StoreError>(())
            })
            .await?;
        Ok(subscription)
    }

    fn leave(&self, feed: &Arc<Feed>) {
        let mut feeds = self.feeds.lock().expect("feeds lock");
        if let Some((current, listeners)) = feeds.get_mut(&feed.session_id) {
            if Arc::ptr_eq(current, feed) {
                *listeners -= 1;
                if *listeners == 0 {
                    feeds.remove(&feed.session_id);
                    feed.stop.cancel();
                }
            }
        }
    }

    fn wake(&self, session_id: &str) {
        if let Some((feed, _)) = self.feeds.lock().expect("feeds lock").get(session_id) {
            feed.wake.notify_one();
        }
    }

    fn wake_all(&self) {
        for (feed, _) in self.feeds.lock().expect("feeds lock").values() {
            feed.wake.notify_one();
        }
    }

    /// Up to `count` events after `after` that the session's stream still keeps, rendered: one page
    /// of a listener's catch-up.
    pub(crate) async fn read_page(
        &self,
        session_id: &str,
        after: StreamId,
        count: usize,
    ) -> Result<Vec<Event>, StoreError> {
        read_batch(&self.store, session_id, after, count).await
    }
}

/// One `read_events` call, rendered: an event whose data is not JSON is skipped.
async fn read_batch(store: &Store, session_id: &str, after: StreamId, count: usize) -> Result<Vec<Event>, StoreError> {
    let raw = store.sessions().read_events(session_id, &after.to_string(), count).await?;
    Ok(raw
        .into_iter()
        .filter_map(|(id, data)| {
            let id = StreamId::parse(&id)?;
            let event: serde_json::Value = serde_json::from_str(&data).ok()?;
            let is_done = event["type"] == "done";
            let frame = Bytes::from(turn::sse_frame(&id.to_string(), &event));
            Some(Event { id, frame, is_done, data: Arc::new(event) })
        })
        .collect())
}

/// A session's reader: on each wake-up, reads everything new and broadcasts it, until the last
/// listener leaves or the hub stops.
async fn read_feed(store: Store, feed: Arc<Feed>, mut cursor: StreamId) {
    loop {
        tokio::select! {
            _ = feed.stop.cancelled() => return,
            _ = feed.wake.notified() => {}
        }
        loop {
            match read_batch(&store, &feed.session_id, cursor, READ_BATCH).await {
                Ok(batch) => {
                    let full = batch.len() >= READ_BATCH;
                    if let Some(last) = batch.last() {
                        cursor = last.id;
                        // No receiver is fine: a listener joining now catches up from Redis.
                        let _ = feed.events.send(Arc::new(batch));
                    }
                    if !full {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading a session's events failed; retrying");
                    tokio::select! {
                        _ = feed.stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    }
                }
            }
        }
    }
}

/// Keeps the process subscribed to event announcements, waking the feeds they name; after a
/// (re)subscription every feed reads once, for what was announced while nobody listened.
async fn listen_for_announcements(hub: Arc<StreamHub>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let subscribed = tokio::select! {
            _ = hub.cancel.cancelled() => return,
            s = hub.store.sessions().subscribe_session_events() => s,
        };
        match subscribed {
            Ok(mut subscription) => {
                backoff = Duration::from_millis(100);
                hub.wake_all();
                loop {
                    tokio::select! {
                        _ = hub.cancel.cancelled() => return,
                        announced = subscription.next() => match announced {
                            Some(session_id) => hub.wake(&session_id),
                            None => break,
                        },
                    }
                }
                tracing::warn!("lost the session-event subscription; resubscribing");
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot subscribe to session-event announcements; retrying");
                tokio::select! {
                    _ = hub.cancel.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
