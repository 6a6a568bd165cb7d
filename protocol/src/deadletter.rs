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
}

impl DeadLetterReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::Exhausted => "exhausted",
            DeadLetterReason::Permanent => "permanent",
            DeadLetterReason::Poison => "poison",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetterRecord {
    pub execution_id: Option<String>,
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
