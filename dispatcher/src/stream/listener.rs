//! One client's stream: the backlog it asked for, then its session feed's events (each sent once,
//! in id order), keep-alives while idle; it ends after `done` when asked to, and when the
//! dispatcher shuts down.

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
        Listener { hub, session_id, subscription, position: Position { last: after, until_done, finished: false } }
    }

    /// The response body: the opening comment and `backlog`, then live events.
    pub(crate) fn into_body(mut self, backlog: Vec<Event>) -> axum::body::Body {
        let mut first = OPENED.to_vec();
        self.position.render(&backlog, &mut first);
        let opening = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from(first))]);
        let live = futures::stream::unfold(self, |mut listener| async move {
            let chunk = listener.next_chunk().await?;
            Some((Ok(chunk), listener))
        });
        axum::body::Body::from_stream(futures::StreamExt::chain(opening, live))
    }

    /// The next bytes to send; `None` ends the stream.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        let stopping = self.hub.stopping().clone();
        loop {
            if self.position.finished {
                return None;
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
                // Fell behind the feed: what was dropped is still in Redis.
                Err(RecvError::Lagged(_)) => match self.hub.read_after(&self.session_id, self.position.last).await {
                    Ok(events) => self.position.render(&events, &mut out),
                    // The client reconnects with `Last-Event-ID` and misses nothing.
                    Err(_) => return None,
                },
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
        Event { id: StreamId::parse(id).unwrap(), frame: Bytes::from(format!("[{id}]")), is_done }
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
    fn until_done_stops_right_after_the_next_done() {
        let mut p = Position { last: StreamId::ZERO, until_done: true, finished: false };
        let events = [event("1-0", false), event("2-0", true), event("3-0", false), event("4-0", true)];
        assert_eq!(sent(&mut p, &events), "[1-0][2-0]");
        assert!(p.finished);
        assert_eq!(sent(&mut p, &[event("5-0", false)]), "", "nothing after the end");
    }
}
