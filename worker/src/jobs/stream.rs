//! A session's stream, as the jobs write it: each event with the seed's base fields.

use serde_json::Value;

use fleet_platform::now_ms;
use fleet_protocol::turn;

use crate::context::Cx;

/// Appends an event to the session's stream, with the seed's base fields (`session_id`,
/// `created_at`); best effort: the stream is a view, the record is the truth.
pub(crate) async fn emit(cx: &Cx<'_>, session_id: &str, event: Value) {
    emit_id(cx, session_id, event).await;
}

/// `emit`, answering the stream id the event got (`None`: it was not appended), for an event that
/// is more than a view: a client tool's `tool_input`, which the client's answer names.
pub(crate) async fn emit_id(cx: &Cx<'_>, session_id: &str, event: Value) -> Option<String> {
    let event = turn::with_base_fields(event, session_id, now_ms());
    match cx.store.sessions().publish_event(session_id, &event).await {
        Ok(id) => Some(id),
        Err(e) => {
            tracing::warn!(error = %e, "cannot publish a stream event");
            None
        }
    }
}

/// Most events one batched write carries.
const BATCH_MAX: usize = 256;

/// A writer for a run of events that come faster than Redis answers (a model's tokens): the sender
/// takes each event as it comes (its base fields stamped then), the writer future appends them in
/// order, each its own entry with its own id, and whatever arrived during one write goes out
/// together in the next (one script, one announcement). The first event is written at once:
/// nothing waits for a batch to fill. The writer ends once the sender is dropped and all is written.
pub(crate) fn batched<'a>(
    cx: &'a Cx<'a>,
    session_id: &'a str,
) -> (EventSender<'a>, impl std::future::Future<Output = ()> + 'a) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let writer = async move {
        let mut events = Vec::new();
        while rx.recv_many(&mut events, BATCH_MAX).await > 0 {
            if let Err(e) = cx.store.sessions().publish_events(session_id, &events).await {
                tracing::warn!(error = %e, "cannot publish stream events");
            }
            events.clear();
        }
    };
    (EventSender { tx, session_id }, writer)
}

/// The sending half of `batched`.
pub(crate) struct EventSender<'a> {
    tx: tokio::sync::mpsc::UnboundedSender<Value>,
    session_id: &'a str,
}

impl EventSender<'_> {
    /// Hands `event` to the writer, stamped with the base fields now.
    pub(crate) fn send(&self, event: Value) {
        let _ = self.tx.send(turn::with_base_fields(event, self.session_id, now_ms()));
    }
}
