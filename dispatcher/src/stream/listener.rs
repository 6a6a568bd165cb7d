//! One client's stream: the backlog it asked for, read a page at a time as the client takes it (a
//! stalled client holds a page, not the retained stream), then its session feed's events (each
//! sent once, in id order), keep-alives while idle; it ends after `done` when asked to, and when
//! the dispatcher shuts down.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::broadcast::error::RecvError;

use super::hub::{Event, StreamHub, Subscription};
use super::request::StreamId;

/// Sent after this much silence, so proxies and browsers keep the connection open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The first bytes of every stream: sent once it is set up, so a client knows it is listening.
const OPENED: &[u8] = b": open\n\n";

pub(crate) struct Listener {
    hub: Arc<StreamHub>,
    session_id: String,
    subscription: Subscription,
    position: Position,
    /// Catching up from Redis (the backlog, or after falling behind the feed), and how many events
    /// the next page asks for.
    catching_up: Option<EventPage>,
}

/// The size of a catch-up page: events are up to 1 MiB each, so a page is sized by the bytes the
/// last one held, between 1 and 100 events. The first is small because its events' size is not
/// known yet: a page of 1 MiB events is held whole while its client does not read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct EventPage {
    count: usize,
}

impl EventPage {
    const FIRST: EventPage = EventPage { count: 4 };
    const MAX_COUNT: usize = 100;
    /// What one page aims to hold.
    const TARGET_BYTES: usize = 1 << 20;

    /// The next page's size after one that held `events` events of `bytes` bytes in all.
    fn next(self, events: usize, bytes: usize) -> EventPage {
        let count = if bytes > EventPage::TARGET_BYTES {
            (self.count / 2).max(1)
        } else if events == self.count && bytes < EventPage::TARGET_BYTES / 4 {
            (self.count * 2).min(EventPage::MAX_COUNT)
        } else {
            self.count
        };
        EventPage { count }
    }
}

/// How far a stream has got (pure): what it sent last and whether it is finished.
#[derive(Debug, Clone, PartialEq)]
struct Position {
    /// The id of the last event sent (or the point the stream started after).
    last: StreamId,
    until_done: bool,
    finished: bool,
}

impl Position {
    /// Appends the frames of `events` not sent yet, in order; with `until_done`, none after `done`.
    /// An event at or before `last` (a backlog read overlapping the feed) is skipped.
    fn render(&mut self, events: &[Event], out: &mut Vec<u8>) {
        for event in events {
            if self.finished {
                return;
            }
            if event.id <= self.last {
                continue;
            }
            out.extend_from_slice(&event.frame);
            self.last = event.id;
            self.finished = self.until_done && event.is_done;
        }
    }
}

impl Listener {
    pub(crate) fn new(
        hub: Arc<StreamHub>,
        session_id: String,
        subscription: Subscription,
        after: StreamId,
        until_done: bool,
    ) -> Self {
        let position = Position { last: after, until_done, finished: false };
        Listener { hub, session_id, subscription, position, catching_up: Some(EventPage::FIRST) }
    }

    /// The response body: the opening comment, then the backlog page by page, then live events.
    pub(crate) fn into_body(self) -> axum::body::Body {
        let opening = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(OPENED))]);
        let live = futures::stream::unfold(self, |mut listener| async move {
            let chunk = listener.next_chunk().await?;
            Some((Ok(chunk), listener))
        });
        axum::body::Body::from_stream(futures::StreamExt::chain(opening, live))
    }

    /// The next page of a catch-up; `None` ends the stream (Redis failed: the client reconnects with
    /// `Last-Event-ID` and misses nothing).
    async fn catch_up(&mut self, page: EventPage) -> Option<Vec<u8>> {
        let events = self.hub.read_page(&self.session_id, self.position.last, page.count).await.ok()?;
        let bytes: usize = events.iter().map(|e| e.frame.len()).sum();
        self.catching_up = (events.len() == page.count).then(|| page.next(events.len(), bytes));
        let mut out = Vec::with_capacity(bytes);
        self.position.render(&events, &mut out);
        Some(out)
    }

    /// The next bytes to send; `None` ends the stream.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        let stopping = self.hub.stopping().clone();
        loop {
            if self.position.finished {
                return None;
            }
            if let Some(page) = self.catching_up {
                let out = self.catch_up(page).await?;
                if !out.is_empty() {
                    return Some(Bytes::from(out));
                }
                continue;
            }
            let received = tokio::select! {
                biased;
                _ = stopping.cancelled() => return None,
                r = self.subscription.events.recv() => r,
                _ = tokio::time::sleep(KEEP_ALIVE) => return Some(Bytes::from_static(b": keep-alive\n\n")),
            };
            let mut out = Vec::new();
            match received {
                Ok(batch) => self.position.render(&batch, &mut out),
                // Fell behind the feed: what was dropped is still in Redis, read page by page.
                Err(RecvError::Lagged(_)) => self.catching_up = Some(EventPage::FIRST),
                Err(RecvError::Closed) => return None,
            }
            if !out.is_empty() {
                return Some(Bytes::from(out));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str, is_done: bool) -> Event {
        let data = Arc::new(serde_json::Value::Null);
        Event { id: StreamId::parse(id).unwrap(), frame: Bytes::from(format!("[{id}]")), is_done, data }
    }

    fn sent(position: &mut Position, events: &[Event]) -> String {
        let mut out = Vec::new();
        position.render(events, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn each_event_is_sent_once_in_order_whatever_overlaps() {
        let mut p = Position { last: StreamId::parse("1-0").unwrap(), until_done: false, finished: false };
        let backlog = [event("1-0", false), event("2-0", false), event("2-1", false)];
        assert_eq!(sent(&mut p, &backlog), "[2-0][2-1]", "the start point itself is not sent again");
        // The feed's batch overlaps what the backlog read already sent.
        let live = [event("2-0", false), event("2-1", false), event("3-0", true), event("4-0", false)];
        assert_eq!(sent(&mut p, &live), "[3-0][4-0]");
        assert!(!p.finished, "done does not end a stream without until=done");
    }

    #[test]
    fn catch_up_pages_follow_the_bytes_they_hold() {
        let page = EventPage::FIRST;
        assert_eq!(page.next(4, 4 * 300).count, 8, "small events: bigger pages");
        assert_eq!(page.next(4, 4 << 20).count, 2, "1 MiB events: smaller pages");
        assert_eq!(EventPage { count: 1 }.next(1, 1 << 20).count, 1, "never below one");
        assert_eq!(EventPage { count: 64 }.next(64, 64 * 300).count, 100, "never above a hundred");
        assert_eq!(EventPage { count: 100 }.next(100, 100).count, 100);
        assert_eq!(page.next(3, 900).count, 4, "a short page ends the catch-up anyway");
    }

    #[test]
    fn until_done_stops_right_after_the_next_done() {
        let mut p = Position { last: StreamId::ZERO, until_done: true, finished: false };
        let events = [event("1-0", false), event("2-0", true), event("3-0", false), event("4-0", true)];
        assert_eq!(sent(&mut p, &events), "[1-0][2-0]");
        assert!(p.finished);
        assert_eq!(sent(&mut p, &[event("5-0", false)]), "", "nothing after the end");
    }
}
