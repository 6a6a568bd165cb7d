//! The dead-letter record: what the dead-letter queue holds for an exhausted, permanently failed
//! or poison job, in the seed's payload shape plus the attempt history and the job to replay.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::execution::AttemptRecord;

/// AMQP `type` property of a dead-letter record message.
pub const RECORD_MESSAGE_TYPE: &str = "fleet.dead_letter";

pub use crate::envelope::DeadLetterReason;

/// A job that failed for good (or a poison message), as kept and as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(as = DeadLetter))]
pub struct DeadLetterRecord {
    pub execution_id: Option<String>,
    /// The job kind (`tool_call`, `webhook`); absent for poison.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub tool_name: Option<String>,
    pub assistant_id: Option<String>,
    pub room_id: Option<String>,
    pub attempts: u32,
    pub last_error: String,
    pub first_attempt_at: Option<String>,
    pub last_attempt_at: Option<String>,
    pub reason: DeadLetterReason,
    pub dead_lettered_at: String,
    // Always written; `default` reads records from before it was.
    #[cfg_attr(feature = "schema", schema(required = true))]
    #[serde(default)]
    pub history: Vec<AttemptRecord>,
    /// The job as it was published, for replay. Never holds a secret (envelopes carry none).
    #[cfg_attr(feature = "schema", schema(value_type = Option<serde_json::Map<String, Value>>))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<Value>,
    /// Poison only: the raw body (lossy UTF-8, truncated), so an operator can see what arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_body: Option<String>,
    /// The tenant whose work it was, stamped when the dead letter is stored: it guards the dead
    /// letter for as long as it is kept (longer than the execution's record lives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// How much of a poison body the record keeps.
pub const MAX_RAW_BODY_CHARS: usize = 16 * 1024;

/// The raw body of a poison message as the record keeps it.
pub fn excerpt_raw_body(body: &[u8]) -> String {
    String::from_utf8_lossy(body).chars().take(MAX_RAW_BODY_CHARS).collect()
}

impl DeadLetterRecord {
    /// The record of a job that ends as a dead letter: the one place a record is built from an
    /// envelope. `history` is the execution's attempts; `first_attempt_at_ms` falls back to the
    /// first recorded attempt.
    pub fn for_job(
        envelope: &crate::envelope::Envelope,
        reason: DeadLetterReason,
        error: &str,
        history: Vec<AttemptRecord>,
        now_ms: i64,
    ) -> Self {
        use crate::envelope::Job;
        use crate::timefmt::rfc3339_from_millis;
        let (tool_name, assistant_id, room_id) = match &envelope.job {
            Job::ToolCall(call) => (Some(call.tool_name.clone()), call.assistant_id.clone(), call.room_id.clone()),
            Job::Webhook(_) => (None, None, None),
            Job::Turn(t) => (None, None, Some(crate::tenant::session_key_shown(&t.session_id).to_string())),
        };
        let first_attempt_at = envelope
            .first_attempt_at_ms
            .map(rfc3339_from_millis)
            .or_else(|| history.first().map(|a| a.started_at.clone()));
        DeadLetterRecord {
            execution_id: Some(envelope.execution_id.clone()),
            kind: Some(envelope.kind().as_str().to_string()),
            tool_name,
            assistant_id,
            room_id,
            attempts: envelope.attempt,
            last_error: crate::sanitize::sanitize_error(if error.is_empty() { "failed" } else { error }),
            first_attempt_at,
            last_attempt_at: history.last().map(|a| a.started_at.clone()),
            reason,
            dead_lettered_at: rfc3339_from_millis(now_ms),
            history,
            job: serde_json::to_value(envelope.as_first_attempt()).ok(),
            raw_body: None,
            tenant: None,
        }
    }

    /// The `tool.callback.failed` event payload: the call failed for good (retries exhausted or a
    /// permanent answer).
    pub fn failed_event_payload(&self) -> Value {
        self.event(crate::events::TOOL_CALLBACK_FAILED, [("failed_at", &self.last_attempt_at)])
    }

    /// The seed's `tool.callback.dead_letter` event payload.
    pub fn event_payload(&self) -> Value {
        self.event(
            crate::events::TOOL_CALLBACK_DEAD_LETTER,
            [("first_attempt_at", &self.first_attempt_at), ("last_attempt_at", &self.last_attempt_at)],
        )
    }

    /// What both events say about the call, and the times each names its own way.
    fn event<const N: usize>(&self, event: &str, times: [(&str, &Option<String>); N]) -> Value {
        let mut data = serde_json::json!({
            "execution_id": self.execution_id,
            "tool_name": self.tool_name,
            "assistant_id": self.assistant_id,
            "room_id": self.room_id,
            "attempts": self.attempts,
            "last_error": self.last_error,
        });
        for (name, at) in times {
            data[name] = serde_json::json!(at);
        }
        serde_json::json!({"event": event, "data": data})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_payload_is_the_seeds() {
        let r = DeadLetterRecord {
            execution_id: Some("exec_xyz".into()),
            kind: Some("tool_call".into()),
            tool_name: Some("search_products".into()),
            assistant_id: Some("asst_abc".into()),
            room_id: Some("room_xyz".into()),
            attempts: 6,
            last_error: "Connection timeout".into(),
            first_attempt_at: Some("2026-01-20T12:00:00Z".into()),
            last_attempt_at: Some("2026-01-20T12:00:31Z".into()),
            reason: DeadLetterReason::Exhausted,
            dead_lettered_at: "2026-01-20T12:00:31Z".into(),
            history: vec![],
            job: None,
            raw_body: None,
            tenant: None,
        };
        let p = r.event_payload();
        assert_eq!(p["event"], "tool.callback.dead_letter");
        assert_eq!(p["data"]["attempts"], 6);
        assert_eq!(p["data"]["last_attempt_at"], "2026-01-20T12:00:31Z");
    }

    #[test]
    fn poison_bodies_are_bounded() {
        assert_eq!(excerpt_raw_body(&vec![b'x'; 100_000]).len(), MAX_RAW_BODY_CHARS);
        assert_eq!(excerpt_raw_body(&[0xff, b'a']), "\u{fffd}a");
    }
}

/// Which dead letters an operator's list, retry or purge applies to. Empty fields match all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterFilter {
    #[serde(default)]
    pub execution_ids: Vec<String>,
    pub tool_name: Option<String>,
    pub reason: Option<DeadLetterReason>,
    /// RFC 3339; dead-lettered at or after.
    pub since: Option<String>,
    /// RFC 3339; dead-lettered before.
    pub until: Option<String>,
}

impl DeadLetterFilter {
    pub fn for_id(id: &str) -> Self {
        DeadLetterFilter { execution_ids: vec![id.to_string()], ..Default::default() }
    }

    /// Checks the time bounds parse; returns the name of the field that does not.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.since.as_deref().is_some_and(|s| crate::timefmt::millis_from_rfc3339(s).is_none()) {
            return Err("since");
        }
        if self.until.as_deref().is_some_and(|s| crate::timefmt::millis_from_rfc3339(s).is_none()) {
            return Err("until");
        }
        Ok(())
    }

    /// The filter as one line (`all` when it has no field), as the audit log names a target.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.execution_ids.is_empty() {
            parts.push(format!("execution_ids={}", self.execution_ids.join(",")));
        }
        let named = [("tool_name", &self.tool_name), ("since", &self.since), ("until", &self.until)];
        parts.extend(named.into_iter().filter_map(|(n, v)| v.as_ref().map(|v| format!("{n}={v}"))));
        if let Some(r) = self.reason {
            parts.push(format!("reason={}", r.as_str()));
        }
        if parts.is_empty() {
            "all".to_string()
        } else {
            parts.join(" ")
        }
    }

    pub fn matches(&self, record: &DeadLetterRecord) -> bool {
        let at = crate::timefmt::millis_from_rfc3339(&record.dead_lettered_at).unwrap_or(0);
        let bound = |b: &Option<String>| b.as_deref().and_then(crate::timefmt::millis_from_rfc3339);
        (self.execution_ids.is_empty()
            || record.execution_id.as_ref().is_some_and(|id| self.execution_ids.contains(id)))
            && self.tool_name.as_ref().is_none_or(|t| record.tool_name.as_ref() == Some(t))
            && self.reason.is_none_or(|r| record.reason == r)
            && bound(&self.since).is_none_or(|s| at >= s)
            && bound(&self.until).is_none_or(|u| at < u)
    }
}

#[cfg(test)]
mod filter_tests {
    use super::*;

    fn record(id: &str, tool: &str, reason: DeadLetterReason, at: &str) -> DeadLetterRecord {
        DeadLetterRecord {
            execution_id: Some(id.into()),
            kind: None,
            tool_name: Some(tool.into()),
            assistant_id: None,
            room_id: None,
            attempts: 6,
            last_error: "HTTP 500".into(),
            first_attempt_at: None,
            last_attempt_at: None,
            reason,
            dead_lettered_at: at.into(),
            history: vec![],
            job: None,
            raw_body: None,
            tenant: None,
        }
    }

    #[test]
    fn filters_by_id_tool_reason_and_time() {
        let r = record("exec_a", "search", DeadLetterReason::Exhausted, "2026-01-20T12:00:00Z");
        assert!(DeadLetterFilter::default().matches(&r));
        assert!(DeadLetterFilter::for_id("exec_a").matches(&r));
        assert!(!DeadLetterFilter::for_id("exec_b").matches(&r));
        let by_tool = DeadLetterFilter { tool_name: Some("other".into()), ..Default::default() };
        assert!(!by_tool.matches(&r));
        let by_reason = DeadLetterFilter { reason: Some(DeadLetterReason::Permanent), ..Default::default() };
        assert!(!by_reason.matches(&r));
        let window = DeadLetterFilter {
            since: Some("2026-01-20T11:00:00Z".into()),
            until: Some("2026-01-20T12:00:00Z".into()),
            ..Default::default()
        };
        assert!(!window.matches(&r), "until is exclusive");
        let window = DeadLetterFilter { until: Some("2026-01-20T12:00:01Z".into()), ..window };
        assert!(window.matches(&r));
        assert_eq!(DeadLetterFilter { since: Some("noon".into()), ..Default::default() }.validate(), Err("since"));
    }
}

/// How long and how many dead letters are kept (`FLEET_DEAD_LETTER_RETENTION`, `FLEET_DEAD_LETTER_MAX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub max_age_ms: i64,
    pub max_count: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention { max_age_ms: 30 * 24 * 3_600_000, max_count: 100_000 }
    }
}

impl Retention {
    /// Index entries scored before this are past retention.
    pub fn cutoff_ms(&self, now_ms: i64) -> i64 {
        now_ms.saturating_sub(self.max_age_ms)
    }

    /// How many of the oldest index entries to drop: every one past retention (`expired`) and
    /// enough to bring `count` down to the maximum, at most `batch` per pass so one save stays cheap.
    pub fn to_drop(&self, expired: u64, count: u64, batch: u64) -> u64 {
        expired.max(count.saturating_sub(self.max_count)).min(batch)
    }
}

/// A position in the newest-first listing: the last entry returned (`<ms>:<id>`). Entries of the
/// same millisecond are ordered by id, descending, so none is skipped between pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCursor {
    pub at_ms: i64,
    pub id: String,
}

impl ListCursor {
    pub fn parse(text: &str) -> Option<Self> {
        let (ms, id) = text.split_once(':')?;
        Some(ListCursor { at_ms: ms.parse().ok()?, id: id.to_string() }).filter(|c| !c.id.is_empty())
    }

    /// Whether the index entry (`id` dead-lettered at `at_ms`) comes after this cursor.
    pub fn precedes(&self, at_ms: i64, id: &str) -> bool {
        at_ms < self.at_ms || (at_ms == self.at_ms && id < self.id.as_str())
    }
}

impl std::fmt::Display for ListCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.at_ms, self.id)
    }
}

/// The record for a message found on the dead-letter queue: the worker's record as is; a job the
/// broker itself dead-lettered (too many redeliveries) as a `delivery_limit` record; anything else
/// as poison with its raw body, so every message can be listed and purged. Every record has an id:
/// a raw body's derives from its bytes, so the same message read twice is one dead letter.
pub fn record_from_message(body: &[u8], content_type: Option<&str>, now_ms: i64) -> DeadLetterRecord {
    use crate::envelope::Envelope;
    if let Ok(record) = serde_json::from_slice::<DeadLetterRecord>(body) {
        if record.execution_id.is_some() {
            return record;
        }
    }
    let dead_lettered_at = crate::timefmt::rfc3339_from_millis(now_ms);
    let Ok(envelope) = Envelope::decode(body, content_type) else {
        let digest = crate::derived_execution_id(&["dead-letter-queue", &String::from_utf8_lossy(body)]);
        return DeadLetterRecord {
            execution_id: Some(format!("poison_{}", digest.trim_start_matches("exec_"))),
            kind: None,
            tool_name: None,
            assistant_id: None,
            room_id: None,
            attempts: 0,
            last_error: "dead-lettered by the broker and not a job".into(),
            first_attempt_at: None,
            last_attempt_at: None,
            reason: DeadLetterReason::Poison,
            dead_lettered_at,
            history: vec![],
            job: None,
            raw_body: Some(excerpt_raw_body(body)),
            tenant: None,
        };
    };
    let error = envelope.settle.as_ref().map_or_else(
        || "redelivered too often (the broker's delivery limit)".to_string(),
        |verdict| verdict.error.clone(),
    );
    DeadLetterRecord::for_job(&envelope, DeadLetterReason::DeliveryLimit, &error, vec![], now_ms)
}

#[cfg(test)]
mod store_tests {
    use super::*;

    #[test]
    fn trimming_drops_the_expired_and_the_excess_in_bounded_batches() {
        let r = Retention { max_age_ms: 1_000, max_count: 5 };
        assert_eq!(r.cutoff_ms(10_000), 9_000);
        assert_eq!(r.to_drop(0, 5, 100), 0, "at the maximum, nothing");
        assert_eq!(r.to_drop(0, 8, 100), 3, "the excess over the maximum");
        assert_eq!(r.to_drop(4, 8, 100), 4, "expired ones cover the excess");
        assert_eq!(r.to_drop(0, 10_000, 500), 500, "one pass is bounded");
        assert_eq!(Retention::default().max_age_ms, 2_592_000_000);
    }

    #[test]
    fn cursors_round_trip_and_order_newest_first() {
        let c = ListCursor::parse("1700:exec_b").unwrap();
        assert_eq!(c.to_string(), "1700:exec_b");
        assert!(c.precedes(1699, "exec_z"), "older");
        assert!(c.precedes(1700, "exec_a"), "same millisecond, lower id");
        assert!(!c.precedes(1700, "exec_b"), "itself was returned");
        assert!(!c.precedes(1701, "exec_a"), "newer");
        assert_eq!(ListCursor::parse("nope"), None);
        assert_eq!(ListCursor::parse("12:"), None);
    }

    #[test]
    fn any_message_becomes_a_record() {
        let raw = record_from_message(b"\x00garbage", Some("text/plain"), 0);
        assert_eq!(raw.reason, DeadLetterReason::Poison);
        assert_eq!(raw.raw_body.as_deref(), Some("\u{0}garbage"));
        let id = raw.execution_id.clone().unwrap();
        assert!(id.starts_with("poison_"));
        assert_eq!(record_from_message(b"\x00garbage", None, 9).execution_id, Some(id), "same body, same id");
        let job = br#"{"v":1,"execution_id":"exec_a1","attempt":3,"enqueued_at_ms":1,"kind":"tool_call",
            "tool_name":"t","parameters":{},"room_id":"r","assistant_id":"a"}"#;
        let limit = record_from_message(job, Some("application/json"), 0);
        assert_eq!(limit.reason, DeadLetterReason::DeliveryLimit);
        assert_eq!(limit.execution_id.as_deref(), Some("exec_a1"));
        assert_eq!(limit.tool_name.as_deref(), Some("t"));
        assert!(limit.job.is_some());
        let record = serde_json::to_vec(&limit).unwrap();
        assert_eq!(record_from_message(&record, None, 5), limit, "a record stays itself");
    }
}
