//! A seed 001 response: a session's events from a cursor, as seed 001 shows them, until the turn
//! the request waits for ends (`done`) or waits for the client's tool outputs
//! (`client_tool_pending`). It reads like a stream listener (the backlog from Redis, then the
//! session's shared feed) and either gathers the events for a 201 body or streams them as SSE.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;

use fleet_platform::store::Store;
use fleet_protocol::agent_session::{self, is_terminal, turn_of};

use super::hub::{Event, StreamHub, Subscription};
use super::request::StreamId;
use super::surface::Listening;

/// Events a catch-up read asks for at once.
const PAGE: usize = 100;
/// Sent after this much silence on an SSE response, so proxies keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Whose end a response waits for.
#[derive(Debug, Clone, Default)]
pub(crate) struct Awaited {
    /// Turns whose `done` (or `client_tool_pending`) ends the response.
    pub(crate) turns: Vec<String>,
    /// A steering input's own turn: the turn it joined (its record's `steered_into`) counts too.
    pub(crate) steered_from: Option<String>,
}

/// Where a response starts and from where an end counts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    /// Events after this one are shown.
    pub(crate) after: StreamId,
    /// Only an end after this one counts (the events before the request's own are history).
    pub(crate) ends_after: StreamId,
}

pub(crate) struct Follow {
    hub: Arc<StreamHub>,
    store: Store,
    session_id: String,
    subscription: Subscription,
    window: Window,
    awaited: Awaited,
    catching_up: bool,
    ready: VecDeque<Value>,
    ended: bool,
    /// Opens a client call's sealed secrets as the client is shown them.
    secrets: fleet_protocol::secrets::SecretsKey,
}

impl Follow {
    /// `subscription` was joined before the request appended its own events, so none is missed.
    pub(crate) fn new(
        hub: Arc<StreamHub>,
        store: Store,
        session_id: String,
        subscription: Subscription,
        window: Window,
        awaited: Awaited,
        secrets: fleet_protocol::secrets::SecretsKey,
    ) -> Self {
        Follow {
            hub,
            store,
            session_id,
            subscription,
            window,
            awaited,
            catching_up: true,
            ready: VecDeque::new(),
            ended: false,
            secrets,
        }
    }

    /// The next seed 001 event; `None` once the awaited end was shown (or the dispatcher stops, or
    /// Redis fails: the caller shows what it has).
    pub(crate) async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(event);
            }
            if self.ended {
                return None;
            }
            let batch = self.next_batch().await?;
            for event in batch.iter() {
                self.take(event).await;
                if self.ended {
                    break;
                }
            }
        }
    }

    async fn next_batch(&mut self) -> Option<Arc<Vec<Event>>> {
        if self.catching_up {
            let page = self.hub.read_page(&self.session_id, self.window.after, PAGE).await.ok()?;
            self.catching_up = page.len() == PAGE;
            return Some(Arc::new(page));
        }
        let stopping = self.hub.stopping().clone();
        let received = tokio::select! {
            biased;
            _ = stopping.cancelled() => return None,
            r = self.subscription.events.recv() => r,
        };
        match received {
            Ok(batch) => Some(batch),
            // Fell behind the feed: what was dropped is still in Redis.
            Err(RecvError::Lagged(_)) => {
                self.catching_up = true;
                Some(Arc::new(vec![]))
            }
            Err(RecvError::Closed) => None,
        }
    }

    async fn take(&mut self, event: &Event) {
        if event.id <= self.window.after {
            return;
        }
        self.window.after = event.id;
        if let Some(mut shown) = agent_session::to_v2(&event.id.to_string(), &event.data) {
            if shown["type"] == "client_tool_pending" {
                // The client needs the secrets its calls' overrides hold: opened only here.
                let owner = agent_session::client_call_owner(&self.session_id);
                let open = |sealed: &str| self.secrets.decrypt(&owner, sealed).ok();
                fleet_protocol::agent_config::unseal(&mut shown["pending_calls"], &open);
            }
            self.ready.push_back(shown);
        }
        if event.id > self.window.ends_after && is_terminal(&event.data) {
            if let Some(turn) = turn_of(&event.data) {
                self.ended = self.ends_with(&turn).await;
            }
        }
    }

    /// Whether `turn`'s end is the awaited one: a turn named, or the turn a steering input joined.
    async fn ends_with(&self, turn: &str) -> bool {
        if self.awaited.turns.iter().any(|t| t == turn) {
            return true;
        }
        let Some(steering) = &self.awaited.steered_from else { return false };
        match self.store.executions().get_execution(steering).await {
            Ok(Some(view)) => view.result.as_ref().is_some_and(|r| r["steered_into"] == turn),
            _ => false,
        }
    }

    /// Gathers the events until the end, or until `deadline` (what came by then is the answer; the
    /// rest can be read from the session's stream after the last event's id).
    pub(crate) async fn gather(mut self, deadline: Duration) -> Vec<Value> {
        let mut events = Vec::new();
        let _ = tokio::time::timeout(deadline, async {
            while let Some(event) = self.next().await {
                events.push(event);
            }
        })
        .await;
        events
    }

    /// The events as SSE (`id:` the event id, `event:` its type), ending after the end. With
    /// `listening`, the request's surface listens to the session while the stream is open: the
    /// stream refreshes its entry and removes it before it ends (a client that hangs up drops it,
    /// and its drop has it removed).
    pub(crate) fn into_sse(self, listening: Option<Listening>) -> axum::body::Body {
        // Silence is broken often enough for the listener's refresh to come in time.
        let quiet = if listening.is_some() { KEEP_ALIVE.min(super::surface::REFRESH) } else { KEEP_ALIVE };
        let live = futures::stream::unfold((self, listening), move |(mut follow, mut listening)| async move {
            let chunk = match tokio::time::timeout(quiet, follow.next()).await {
                Ok(Some(event)) => Bytes::from(frame(&event)),
                Ok(None) => {
                    if let Some(listening) = listening.take() {
                        listening.close().await;
                    }
                    return None;
                }
                Err(_) => Bytes::from_static(b": keep-alive\n\n"),
            };
            if let Some(listening) = listening.as_mut() {
                listening.refresh_if_due().await;
            }
            Some((Ok::<_, std::io::Error>(chunk), (follow, listening)))
        });
        axum::body::Body::from_stream(live)
    }
}

/// One seed 001 event as an SSE frame.
fn frame(event: &Value) -> String {
    let id = event["id"].as_str().unwrap_or_default();
    let kind = event["type"].as_str().unwrap_or("message");
    format!("id: {id}\nevent: {kind}\ndata: {event}\n\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_frame_names_the_event_and_its_id() {
        let event = serde_json::json!({"id": "aev_1-0", "type": "agent_output", "content": "hi"});
        let f = super::frame(&event);
        assert!(f.starts_with("id: aev_1-0\nevent: agent_output\ndata: {"), "{f}");
        assert!(f.ends_with("}\n\n"));
    }
}
