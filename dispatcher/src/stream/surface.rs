//! A streaming request's surface as a listener of its session (seed 001's "listeners"): its entry
//! is written when the SSE answer opens, refreshed while the stream stays open and removed when it
//! ends. A client that hangs up drops the stream; the removal then runs as a task the hub owns
//! and awaits. A dispatcher that dies leaves an entry that lapses on its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_platform::store::Store;
use fleet_protocol::surfaces::{Surface, LISTENER_REFRESH_MS, LISTENER_TTL_MS};

use super::hub::StreamHub;

/// How often an open stream refreshes its entry.
pub(crate) const REFRESH: Duration = Duration::from_millis(LISTENER_REFRESH_MS);
const TTL: Duration = Duration::from_millis(LISTENER_TTL_MS);

/// One open stream's entry in its session's listeners; dropped unclosed, it has the hub remove it.
pub(crate) struct Listening {
    hub: Arc<StreamHub>,
    store: Store,
    session_id: String,
    entry: String,
    refreshed: Instant,
    /// Whether the entry may still be in Redis (cleared by `close`).
    owed: bool,
}

impl Listening {
    /// Registers `surface` as listening to `session_id`. A failed write is logged, not fatal: the
    /// input is accepted already, and the next refresh writes the entry again.
    pub(crate) async fn open(hub: Arc<StreamHub>, store: Store, session_id: &str, surface: &Surface) -> Listening {
        let stream: [u8; 12] = rand::random();
        let mut listening = Listening {
            hub,
            store,
            session_id: session_id.to_string(),
            entry: surface.listener_entry(&hex::encode(stream)),
            refreshed: Instant::now(),
            owed: true,
        };
        listening.write().await;
        listening
    }

    async fn write(&mut self) {
        if let Err(e) = self.store.sessions().listen(&self.session_id, &self.entry, TTL).await {
            tracing::warn!(error = %e, "could not register a streaming surface as a listener");
        }
        self.refreshed = Instant::now();
    }

    /// Writes the entry again if its last write is `REFRESH` old.
    pub(crate) async fn refresh_if_due(&mut self) {
        if refresh_due(self.refreshed.elapsed()) {
            self.write().await;
        }
    }

    /// Removes the entry (the stream ended), before the stream's end reaches the client.
    pub(crate) async fn close(mut self) {
        self.owed = false;
        remove(self.store.clone(), std::mem::take(&mut self.session_id), std::mem::take(&mut self.entry)).await;
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        if self.owed {
            let removal =
                remove(self.store.clone(), std::mem::take(&mut self.session_id), std::mem::take(&mut self.entry));
            self.hub.track(removal);
        }
    }
}

async fn remove(store: Store, session_id: String, entry: String) {
    if let Err(e) = store.sessions().stop_listening(&session_id, &entry).await {
        // It lapses by itself within the listener TTL.
        tracing::warn!(error = %e, "could not remove a closed stream's listener entry");
    }
}

/// Whether an entry written `since` ago is due a refresh: early enough that a refresh made as late
/// as one more `REFRESH` still lands within its TTL.
fn refresh_due(since: Duration) -> bool {
    since >= REFRESH
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_refreshed_each_interval_and_two_intervals_fit_in_its_ttl() {
        assert!(!refresh_due(Duration::from_secs(1)));
        assert!(refresh_due(REFRESH));
        assert!(REFRESH * 2 < TTL, "a refresh comes at most two intervals after the last write");
    }
}
