//! A client's `Idempotency-Key` as stored: which execution it names, a digest of the body it came
//! with, and whether that execution's publish was confirmed; and what a stored key means for a new
//! request with the same key.

use serde::{Deserialize, Serialize};

/// Where the acceptance of a key's execution stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestState {
    /// A request is publishing the execution right now (until `pending_until_ms`).
    Pending,
    /// A publish was attempted but never confirmed: the job may or may not be on the queue.
    Unconfirmed,
    /// The broker confirmed the job.
    Confirmed,
}

/// The value stored under a request key (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub execution_id: String,
    /// Hex SHA-256 of the request's body; absent in keys written before digests were stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_digest: Option<String>,
    pub state: RequestState,
    /// A pending reservation is abandoned after this (ms since the epoch): its request crashed.
    #[serde(default)]
    pub pending_until_ms: i64,
    /// Tells one request's hold from another's, so a request only ever undoes its own write.
    #[serde(default)]
    pub hold: u64,
}

impl RequestRecord {
    pub fn pending(execution_id: &str, body_digest: &str, pending_until_ms: i64, hold: u64) -> Self {
        RequestRecord {
            execution_id: execution_id.to_string(),
            body_digest: Some(body_digest.to_string()),
            state: RequestState::Pending,
            pending_until_ms,
            hold,
        }
    }

    /// Reads a stored value, including the two older forms: `pending:<id>` (read as a pending
    /// reservation already expired) and a bare `<id>` (confirmed, body unknown).
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.starts_with('{') {
            return serde_json::from_str(raw).map_err(|e| format!("request key: {e}"));
        }
        let (state, id) = match raw.strip_prefix("pending:") {
            Some(id) => (RequestState::Pending, id),
            None => (RequestState::Confirmed, raw),
        };
        if !crate::envelope::is_valid_execution_id(id) {
            return Err(format!("request key: {raw:?} names no execution"));
        }
        Ok(RequestRecord { execution_id: id.into(), body_digest: None, state, pending_until_ms: 0, hold: 0 })
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a request record serialises")
    }

    pub fn with_state(&self, state: RequestState, pending_until_ms: i64, hold: u64) -> Self {
        RequestRecord { state, pending_until_ms, hold, ..self.clone() }
    }
}

/// What a stored key means for a request that carries it with `body_digest` at `now_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The execution was accepted: answer it again.
    Replay(String),
    /// Another request is accepting it right now.
    InProgress,
    /// The key came with a different body: refuse.
    Reused,
    /// Never confirmed and nobody is publishing it: publish the same execution again.
    Republish(String),
}

pub fn decide(stored: &RequestRecord, body_digest: &str, now_ms: i64) -> Decision {
    if stored.body_digest.as_deref().is_some_and(|d| d != body_digest) {
        return Decision::Reused;
    }
    match stored.state {
        RequestState::Confirmed => Decision::Replay(stored.execution_id.clone()),
        RequestState::Pending if stored.pending_until_ms > now_ms => Decision::InProgress,
        RequestState::Pending | RequestState::Unconfirmed => Decision::Republish(stored.execution_id.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "exec_0123456789abcdef0123456789abcdef";

    #[test]
    fn a_live_reservation_is_in_progress_and_an_expired_one_is_republished() {
        let r = RequestRecord::pending(ID, "d1", 1_000, 7);
        assert_eq!(decide(&r, "d1", 999), Decision::InProgress);
        assert_eq!(decide(&r, "d1", 1_000), Decision::Republish(ID.into()));
        let r = r.with_state(RequestState::Unconfirmed, 0, 7);
        assert_eq!(decide(&r, "d1", 0), Decision::Republish(ID.into()));
    }

    #[test]
    fn a_confirmed_key_replays_and_another_body_is_refused_whatever_the_state() {
        let r = RequestRecord::pending(ID, "d1", 1_000, 7).with_state(RequestState::Confirmed, 0, 7);
        assert_eq!(decide(&r, "d1", 5_000), Decision::Replay(ID.into()));
        for state in [RequestState::Pending, RequestState::Unconfirmed, RequestState::Confirmed] {
            assert_eq!(decide(&r.with_state(state, 9_999, 1), "d2", 0), Decision::Reused);
        }
    }

    #[test]
    fn older_forms_are_read() {
        let r = RequestRecord::parse(&format!("pending:{ID}")).unwrap();
        assert_eq!(decide(&r, "any", 0), Decision::Republish(ID.into()), "no expiry was stored: expired");
        let r = RequestRecord::parse(ID).unwrap();
        assert_eq!(decide(&r, "any", 0), Decision::Replay(ID.into()), "no digest was stored: any body");
        assert!(RequestRecord::parse("garbage").is_err());
        let r = RequestRecord::pending(ID, "d", 5, 9);
        assert_eq!(RequestRecord::parse(&r.to_json()).unwrap(), r);
    }
}
