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
    /// The id of the last event sent (or the point the stream started after).
    last: StreamId,
    until_done: bool,
    finished: bool,
}

impl Listener {
    pub(crate) fn new(
        hub: Arc<StreamHub>,
        session_id: String,
        subscription: Subscription,
        after: StreamId,
        until_done: bool,
    ) -> Self {
        Listener { hub, session_id, subscription, last: after, until_done, finished: false }
    }

    /// The frames of `events` not sent yet, in order; with `until_done`, none after `done`.
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

    /// The response body: the opening comment and `backlog`, then live events.
    pub(crate) fn into_body(mut self, backlog: Vec<Event>) -> axum::body::Body {
        let mut first = OPENED.to_vec();
        self.render(&backlog, &mut first);
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
            if self.finished {
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
                Ok(batch) => self.render(&batch, &mut out),
                // Fell behind the feed: what was dropped is still in Redis.
                Err(RecvError::Lagged(_)) => match self.hub.read_after(&self.session_id, self.last).await {
                    Ok(events) => self.render(&events, &mut out),
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
