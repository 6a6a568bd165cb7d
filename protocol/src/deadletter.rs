//! The dead-letter record: what the dead-letter queue holds for an exhausted, permanently failed
//! or poison job, in the seed's payload shape plus the attempt history and the job to replay.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::execution::AttemptRecord;

/// AMQP `type` property of a dead-letter record message.
pub const RECORD_MESSAGE_TYPE: &str = "fleet.dead_letter";

/// Why a job was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadLetterReason {
    /// All attempts failed with retryable errors.
    Exhausted,
    /// The tool owner answered with a permanent failure (or the target is forbidden).
    Permanent,
    /// The message could not be parsed as a job.
    Poison,
    /// The broker dead-lettered the job after too many redeliveries (it kept losing its worker).
    DeliveryLimit,
}

impl DeadLetterReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::Exhausted => "exhausted",
            DeadLetterReason::Permanent => "permanent",
            DeadLetterReason::Poison => "poison",
            DeadLetterReason::DeliveryLimit => "delivery_limit",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    #[serde(default)]
    pub history: Vec<AttemptRecord>,
    /// The job as it was published, for replay. Never holds a secret (envelopes carry none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<Value>,
    /// For poison: the raw body (lossy UTF-8, truncated), so an operator can see what arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_body: Option<String>,
}

/// How much of a poison body the record keeps.
pub const MAX_RAW_BODY_CHARS: usize = 16 * 1024;

/// The raw body of a poison message as the record keeps it.
pub fn excerpt_raw_body(body: &[u8]) -> String {
    String::from_utf8_lossy(body).chars().take(MAX_RAW_BODY_CHARS).collect()
}

impl DeadLetterRecord {
    /// The `tool.callback.failed` event payload: the call failed for good (retries exhausted or a
    /// permanent answer).
    pub fn failed_event_payload(&self) -> Value {
        serde_json::json!({
            "event": crate::events::TOOL_CALLBACK_FAILED,
            "data": {
                "execution_id": self.execution_id,
                "tool_name": self.tool_name,
                "assistant_id": self.assistant_id,
                "room_id": self.room_id,
                "attempts": self.attempts,
                "last_error": self.last_error,
                "failed_at": self.last_attempt_at,
            }
        })
    }

    /// The seed's `tool.callback.dead_letter` event payload.
    pub fn event_payload(&self) -> Value {
        serde_json::json!({
            "event": "tool.callback.dead_letter",
            "data": {
                "execution_id": self.execution_id,
                "tool_name": self.tool_name,
                "assistant_id": self.assistant_id,
                "room_id": self.room_id,
                "attempts": self.attempts,
                "last_error": self.last_error,
                "first_attempt_at": self.first_attempt_at,
                "last_attempt_at": self.last_attempt_at,
            }
        })
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
