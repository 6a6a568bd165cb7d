//! The execution record: the status of one job and its attempt history, as workers write it to
//! Redis and the dispatcher serves it at `GET /v1/executions/{id}`.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::envelope::JobKind;

/// Hash fields of the execution record (`Keys::execution`).
pub mod field {
    pub const KIND: &str = "kind";
    pub const STATUS: &str = "status";
    pub const TOOL_NAME: &str = "tool_name";
    pub const ROOM_ID: &str = "room_id";
    pub const ASSISTANT_ID: &str = "assistant_id";
    /// Whose work it is (`tenant::resolve`).
    pub const TENANT: &str = "tenant";
    pub const CREATED_AT_MS: &str = "created_at_ms";
    pub const UPDATED_AT_MS: &str = "updated_at_ms";
    pub const ATTEMPTS: &str = "attempts";
    pub const RESULT: &str = "result";
    pub const LAST_ERROR: &str = "last_error";
    /// Seed 002's `ExternalResult` (JSON) a tool call ended with, when it answered one.
    pub const EXTERNAL_RESULT: &str = "external_result";
    /// The newest claim token that wrote to the record; a write carrying an older one is refused.
    pub const FENCE: &str = "fence";
    /// When (ms) a client asked to cancel the execution (`POST /v1/executions/{id}/cancel`); a
    /// worker reads it before a tool call's attempt and before a turn's model call.
    pub const CANCEL_REQUESTED: &str = "cancel_requested";
    /// When (ms) a scheduled call (`run_at`, `delay_seconds`) is due; absent for one that runs now.
    pub const RUN_AT_MS: &str = "run_at_ms";
    /// The step the record expects next (`life::Step`): generation, round, attempt, poll. A delivery
    /// of an earlier step is a copy.
    pub const GEN: &str = "gen";
    pub const STEP_ROUND: &str = "s_round";
    pub const STEP_ATTEMPT: &str = "s_attempt";
    pub const STEP_POLL: &str = "s_poll";
    /// What the last transition still owes (`life::Owed`, JSON), empty when nothing.
    pub const OWED: &str = "owed";
    /// Until when (ms) a claim holder owes the work `OWED` names: past it, the next delivery may
    /// settle what is owed.
    pub const OWED_UNTIL: &str = "owed_until";
    /// The park marker: a step parked by its claim holder (`Envelope::park`) once the parked
    /// delivery's publish was confirmed: the step (`gen:round:attempt:poll`), the claim token the
    /// parked delivery carries, and when (ms) it is due back. Until then (and a slack) a delivery
    /// of that step carrying another park is a copy. Cleared by the next claim.
    pub const PARKED_STEP: &str = "parked_step";
    pub const PARKED_BY: &str = "parked_by";
    pub const PARKED_UNTIL: &str = "parked_until";
    /// A turn waiting for its tools: the keys of the round's calls (comma-separated), so the report
    /// that completes the round is known in the turn's own slot.
    pub const PENDING: &str = "pending";
    /// The round whose step a completed round of tool calls already published.
    pub const NEXT_PUBLISHED: &str = "next_published";
    /// A turn's latest model call's message id: the one its round's tool results stream under.
    pub const MESSAGE_ID: &str = "message_id";

    /// Every field, by the name its constant has: the Lua scripts read them from this list.
    pub const ALL: &[(&str, &str)] = &[
        ("kind", KIND),
        ("status", STATUS),
        ("tool_name", TOOL_NAME),
        ("room_id", ROOM_ID),
        ("assistant_id", ASSISTANT_ID),
        ("tenant", TENANT),
        ("created_at_ms", CREATED_AT_MS),
        ("updated_at_ms", UPDATED_AT_MS),
        ("attempts", ATTEMPTS),
        ("result", RESULT),
        ("last_error", LAST_ERROR),
        ("external_result", EXTERNAL_RESULT),
        ("fence", FENCE),
        ("cancel_requested", CANCEL_REQUESTED),
        ("run_at_ms", RUN_AT_MS),
        ("gen", GEN),
        ("step_round", STEP_ROUND),
        ("step_attempt", STEP_ATTEMPT),
        ("step_poll", STEP_POLL),
        ("owed", OWED),
        ("owed_until", OWED_UNTIL),
        ("parked_step", PARKED_STEP),
        ("parked_by", PARKED_BY),
        ("parked_until", PARKED_UNTIL),
        ("pending", PENDING),
        ("next_published", NEXT_PUBLISHED),
        ("message_id", MESSAGE_ID),
    ];
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    Queued,
    Running,
    Retrying,
    Succeeded,
    Failed,
    DeadLettered,
    /// Cancelled by a client before it ran (a tool call) or before its next model call (a turn).
    Cancelled,
}

impl ExecutionStatus {
    pub const ALL: [ExecutionStatus; 7] = [
        ExecutionStatus::Queued,
        ExecutionStatus::Running,
        ExecutionStatus::Retrying,
        ExecutionStatus::Succeeded,
        ExecutionStatus::Failed,
        ExecutionStatus::DeadLettered,
        ExecutionStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionStatus::Queued => "queued",
            ExecutionStatus::Running => "running",
            ExecutionStatus::Retrying => "retrying",
            ExecutionStatus::Succeeded => "succeeded",
            ExecutionStatus::Failed => "failed",
            ExecutionStatus::DeadLettered => "dead_lettered",
            ExecutionStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(text.to_string())).ok()
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            ExecutionStatus::Succeeded
                | ExecutionStatus::Failed
                | ExecutionStatus::DeadLettered
                | ExecutionStatus::Cancelled
        )
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    Success,
    Retry,
    Permanent,
    Exhausted,
}

/// One attempt in an execution's history: its number, start, duration and outcome, and the
/// receiver's HTTP status or the error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(as = Attempt))]
pub struct AttemptRecord {
    pub attempt: u32,
    /// RFC 3339 start time.
    pub started_at: String,
    pub duration_ms: u64,
    /// The receiver's answer, when it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// What went wrong (sanitised), when something did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub outcome: AttemptOutcome,
    /// Tokens a model attempt used, as the provider reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<u64>,
    /// The attempt ran out of time (its structured result, if it was the last, is `timeout`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
}

/// An execution's record: the one shape of the hash `keys::execution` names, read and written
/// here only. A listing shows it as it is; an execution's view adds its result and attempts
/// (kept beside it); the API's answers are derived from it.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionRecord {
    pub execution_id: String,
    pub kind: JobKind,
    pub status: ExecutionStatus,
    pub tool_name: Option<String>,
    /// The room (session) a turn or its tool call belongs to, as stored.
    pub room_id: Option<String>,
    pub assistant_id: Option<String>,
    /// Whose work it is (`tenant::resolve`); `None` for a record from before tenants.
    pub tenant: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// When a scheduled call is due (ms); `None` for one that ran (or runs) as soon as it could.
    pub run_at_ms: Option<i64>,
    /// Attempts made so far.
    pub attempts: u32,
    pub last_error: Option<String>,
}

impl ExecutionRecord {
    /// The record in `hash` (its fields as stored); `Err` names the field that cannot be read.
    pub fn from_fields(execution_id: &str, hash: &HashMap<String, String>) -> Result<Self, &'static str> {
        let num = |name: &str| hash.get(name).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        let text = |name: &str| hash.get(name).cloned();
        Ok(ExecutionRecord {
            execution_id: execution_id.to_string(),
            kind: hash.get(field::KIND).and_then(|k| JobKind::parse(k)).ok_or(field::KIND)?,
            status: hash.get(field::STATUS).and_then(|s| ExecutionStatus::parse(s)).ok_or(field::STATUS)?,
            tool_name: text(field::TOOL_NAME),
            room_id: text(field::ROOM_ID),
            assistant_id: text(field::ASSISTANT_ID),
            tenant: text(field::TENANT),
            created_at_ms: num(field::CREATED_AT_MS),
            updated_at_ms: num(field::UPDATED_AT_MS),
            run_at_ms: hash.get(field::RUN_AT_MS).and_then(|v| v.parse().ok()),
            attempts: num(field::ATTEMPTS).max(0) as u32,
            last_error: text(field::LAST_ERROR),
        })
    }
}

/// What a new execution record starts with (borrowed: it is written once, on the enqueue path).
/// Its fields are the record's: `fields` writes them as `ExecutionRecord::from_fields` reads them.
#[derive(Debug, Clone, Copy)]
pub struct NewExecution<'a> {
    pub execution_id: &'a str,
    pub kind: JobKind,
    pub tool_name: Option<&'a str>,
    pub room_id: Option<&'a str>,
    pub assistant_id: Option<&'a str>,
    /// Whose work it is.
    pub tenant: Option<&'a str>,
    pub now_ms: i64,
    /// When a scheduled call is due (ms); it counts as waiting only from then.
    pub run_at_ms: Option<i64>,
}

impl NewExecution<'_> {
    /// The record's fields as written: `queued`, no attempt made.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![
            (field::KIND, self.kind.as_str().to_string()),
            (field::STATUS, ExecutionStatus::Queued.as_str().to_string()),
            (field::CREATED_AT_MS, self.now_ms.to_string()),
            (field::UPDATED_AT_MS, self.now_ms.to_string()),
            (field::ATTEMPTS, "0".to_string()),
        ];
        for (name, value) in [
            (field::TOOL_NAME, self.tool_name),
            (field::ROOM_ID, self.room_id),
            (field::ASSISTANT_ID, self.assistant_id),
            (field::TENANT, self.tenant),
        ] {
            if let Some(v) = value {
                fields.push((name, v.to_string()));
            }
        }
        if let Some(due) = self.run_at_ms {
            fields.push((field::RUN_AT_MS, due.to_string()));
        }
        fields
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_use_the_spec_words() {
        for s in ["queued", "running", "retrying", "succeeded", "failed", "dead_lettered", "cancelled"] {
            assert_eq!(ExecutionStatus::parse(s).unwrap().as_str(), s);
        }
        assert_eq!(ExecutionStatus::parse("done"), None);
        assert!(ExecutionStatus::DeadLettered.is_final() && !ExecutionStatus::Retrying.is_final());
        assert!(ExecutionStatus::Cancelled.is_final());
    }

    #[test]
    fn a_new_record_reads_back_as_the_record_it_wrote() {
        let new = NewExecution {
            execution_id: "exec_1",
            kind: JobKind::ToolCall,
            tool_name: Some("search"),
            room_id: None,
            assistant_id: None,
            tenant: Some("acme"),
            now_ms: 7,
            run_at_ms: Some(9),
        };
        let hash: HashMap<String, String> = new.fields().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let record = ExecutionRecord::from_fields("exec_1", &hash).unwrap();
        assert_eq!(record.kind, JobKind::ToolCall);
        assert_eq!(record.status, ExecutionStatus::Queued);
        assert_eq!((record.tool_name.as_deref(), record.tenant.as_deref()), (Some("search"), Some("acme")));
        assert_eq!((record.created_at_ms, record.run_at_ms, record.attempts), (7, Some(9), 0));
        let mut unknown = hash.clone();
        unknown.insert(field::KIND.into(), "notification".into());
        assert_eq!(ExecutionRecord::from_fields("exec_1", &unknown), Err(field::KIND));
    }
}
