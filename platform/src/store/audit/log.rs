//! The operators' audit log: every change made through an operator route, the console or
//! `fleetctl` (a retry, redrive, purge, cancel, circuit close, session forget) as one entry of a
//! Redis stream (who, when, what, how many), capped at a number of entries, newest first when read.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::Value;

use super::Audit;
use crate::store::StoreError;

/// Entries the log keeps (approximately: the stream is trimmed in whole nodes).
pub const AUDIT_MAX_ENTRIES: u64 = 100_000;

/// One change, as written.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEvent<'a> {
    /// Who: `token:<digest prefix>` (through the API or the console), or `fleetctl:<user>`.
    pub actor: &'a str,
    /// Through what: `api`, `console` or `fleetctl`.
    pub via: &'a str,
    /// What: `dead_letter.retry`, `dead_letters.redrive`, `dead_letters.purge`, `dead_letter.delete`,
    /// `execution.cancel`, `circuit.close`, `session.forget`, `approval.approve`, `approval.deny`.
    pub action: &'a str,
    /// What it acted on: an id, a tool, a session, or the filter of a bulk operation.
    pub target: &'a str,
    /// How many it changed.
    pub count: u64,
    /// Anything more worth keeping (an edit's parameters, a bulk report); never a secret.
    pub detail: Option<&'a Value>,
}

/// One entry, as read back.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEntry {
    /// The stream id: a cursor, and when (ms) it was written.
    pub id: String,
    pub at_ms: i64,
    pub actor: String,
    pub via: String,
    pub action: String,
    pub target: String,
    pub count: u64,
    pub detail: Option<Value>,
}

fn entry(id: String, fields: HashMap<String, String>) -> AuditEntry {
    let at_ms = id.split('-').next().and_then(|ms| ms.parse().ok()).unwrap_or(0);
    let get = |name: &str| fields.get(name).cloned().unwrap_or_default();
    AuditEntry {
        at_ms,
        actor: get("actor"),
        via: get("via"),
        action: get("action"),
        target: get("target"),
        count: fields.get("count").and_then(|c| c.parse().ok()).unwrap_or(0),
        detail: fields.get("detail").and_then(|d| serde_json::from_str(d).ok()),
        id,
    }
}

/// Whether `cursor` is a stream id this log hands out (`<ms>-<seq>`).
pub fn is_cursor(cursor: &str) -> bool {
    cursor.split_once('-').is_some_and(|(ms, seq)| {
        !ms.is_empty() && !seq.is_empty() && ms.bytes().chain(seq.bytes()).all(|b| b.is_ascii_digit())
    })
}

impl Audit {
    /// Appends one change to the audit log.
    pub async fn record(&self, e: &AuditEvent<'_>) -> Result<String, StoreError> {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.redis.keys().audit_log()).arg("MAXLEN").arg("~").arg(AUDIT_MAX_ENTRIES).arg("*");
        cmd.arg("actor").arg(e.actor).arg("via").arg(e.via).arg("action").arg(e.action);
        cmd.arg("target").arg(e.target).arg("count").arg(e.count);
        if let Some(detail) = e.detail {
            cmd.arg("detail").arg(detail.to_string());
        }
        let r: Result<String, _> = cmd.query_async(&mut self.redis.conn().await?).await;
        self.redis.count(r)
    }

    /// Entries newest first, before `cursor` (a stream id) if given; the cursor of the next page,
    /// if there may be one.
    pub async fn audit_page(
        &self,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<AuditEntry>, Option<String>), StoreError> {
        let end = cursor.map(|c| format!("({c}")).unwrap_or_else(|| "+".into());
        type Raw = Vec<(String, HashMap<String, String>)>;
        let r: Result<Raw, _> = redis::cmd("XREVRANGE")
            .arg(self.redis.keys().audit_log())
            .arg(end)
            .arg("-")
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut self.redis.conn().await?)
            .await;
        let entries: Vec<AuditEntry> = self.redis.count(r)?.into_iter().map(|(id, f)| entry(id, f)).collect();
        let next = (entries.len() == limit).then(|| entries.last().map(|e| e.id.clone())).flatten();
        Ok((entries, next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_its_time_from_its_id_and_a_cursor_is_a_stream_id() {
        let fields: HashMap<String, String> = [("actor", "token:ab"), ("action", "circuit.close"), ("count", "1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let e = entry("1700000000000-3".into(), fields);
        assert_eq!((e.at_ms, e.count, e.action.as_str(), e.detail), (1_700_000_000_000, 1, "circuit.close", None));
        assert!(is_cursor("1700000000000-3"));
        assert!(!is_cursor("1700000000000") && !is_cursor("a-1") && !is_cursor("-1") && !is_cursor("1-"));
    }
}
