//! How a job's delivery ends, as plain types: every stage of a job returns `Result<T, Outcome>`,
//! and `settle` carries the outcome out. This module imports nothing from the crate.

use std::time::Duration;

use fleet_protocol::envelope::DeadLetterReason;
use fleet_protocol::execution::AttemptRecord;

/// The claim a job's work runs under: its token fences every write of the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeldClaim {
    pub token: u64,
}

/// How a job's delivery ends.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Its work is done (or was already): ack.
    Done(Finished),
    /// A copy of the job (an earlier step, or an execution that ended): ack, count, nothing else.
    Copy,
    /// The attempt failed: its schedule decides between another attempt and the dead letter.
    Failed(Failure),
    /// Give up on the job.
    DeadLetter(DeadLetter),
    /// A newer claim owns the job: nothing more is written or scheduled.
    Fenced,
    /// Hold the job in a delay queue without spending an attempt (its claim given back).
    Parked(Duration),
    /// `Parked` by the step's claim holder, its claim (this token) given back: once the parked
    /// delivery is published, the record is marked parked, so a copy arriving meanwhile is only
    /// acked (over a budget, a tenant's turn slots, a tool's limits).
    ParkedStep(Duration, u64),
    /// The attempt goes on in the broker: the next poll of a 202's status URL.
    Poll(Box<fleet_protocol::envelope::PollState>, HeldClaim),
    /// Return it to its queue now (a write it depends on failed).
    Requeue,
    /// Neither ack nor requeue: its connection is gone, and the broker returns it by itself.
    Abandon,
    /// A copy of an earlier step, and the record owes something: the copy carries it out (with the
    /// execution's result, where it has one). `jobs::run` resolves this before settling.
    Owed(fleet_protocol::life::Owed, Option<serde_json::Value>),
}

impl From<Settle> for Outcome {
    /// A publish that could not be completed ends the delivery as the publish's wait ended.
    fn from(settle: Settle) -> Self {
        match settle {
            Settle::Ack => Outcome::Done(Finished::Owed),
            Settle::Requeue => Outcome::Requeue,
            Settle::Abandon => Outcome::Abandon,
        }
    }
}

/// What a finished delivery did: the `outcome` label of `fleet_jobs_finished_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finished {
    Success,
    /// A redelivery or replay of finished work: nothing ran again.
    Duplicate,
    /// A copy carried out what an earlier delivery owed (a publish, a dead letter, a report).
    Owed,
    /// A steer handed to the running turn of its session.
    Steered,
    Cancelled,
    /// A turn's call answered `tool_unavailable` (its tool's circuit is open).
    ToolUnavailable,
    /// A turn whose prompt exceeds its model's context window, ended before its model call.
    ContextLimit,
    /// A tool answered seed 002's structured result with a status other than `success`.
    ToolFailed,
    /// A turn's call its approval refused (denied, or undecided by its deadline): nothing sent.
    Refused,
}

impl Finished {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Finished::Success => "success",
            Finished::Duplicate => "duplicate",
            Finished::Owed => "owed",
            Finished::Steered => "steered",
            Finished::Cancelled => "cancelled",
            Finished::ToolUnavailable => "tool_unavailable",
            Finished::ContextLimit => "context_limit_exceeded",
            Finished::ToolFailed => "tool_failed",
            Finished::Refused => "approval_refused",
        }
    }
}

/// An attempt that failed: `settle` decides between another attempt and the dead letter.
#[derive(Debug)]
pub(crate) struct Failure {
    pub record: AttemptRecord,
    pub error: String,
    pub retry_after: Option<Duration>,
    pub permanent: bool,
    pub held: HeldClaim,
    /// When the attempt started (ms), for `first_attempt_at`.
    pub started_ms: i64,
}

/// A job given up on. `record` is its last attempt, not yet recorded; `code` names the failure in
/// a turn's `error` event; `held` is the claim it is given up under (none: a copy carrying out a
/// dead letter the record already owes).
#[derive(Debug)]
pub(crate) struct DeadLetter {
    pub reason: DeadLetterReason,
    pub error: String,
    pub record: Option<AttemptRecord>,
    pub held: Option<HeldClaim>,
    pub code: Option<&'static str>,
}

/// What happens to the delivery itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    Ack,
    Requeue,
    /// Neither: the channel is gone, and the broker returns the delivery by itself.
    Abandon,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finish_has_its_own_label() {
        let all = [
            Finished::Success,
            Finished::Duplicate,
            Finished::Owed,
            Finished::Steered,
            Finished::Cancelled,
            Finished::ToolUnavailable,
            Finished::ContextLimit,
            Finished::ToolFailed,
            Finished::Refused,
        ];
        let labels: std::collections::HashSet<_> = all.iter().map(|f| f.label()).collect();
        assert_eq!(labels.len(), all.len());
    }
}
