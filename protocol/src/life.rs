//! An execution's life as its record tracks it: the step a delivery stands for, the step the
//! record expects next, and what a transition still owes the broker. A delivery runs only if it
//! carries the step the record expects (or a later one, after writes lost in a Redis failover);
//! an earlier step is a copy: acked, counted, and it changes nothing. Only an operator's retry of
//! a dead letter starts a new generation, which makes every job from before it a copy.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::envelope::{Envelope, Verdict};

/// A moment of an execution's life, ordered: a later generation (an operator's replay) beats
/// everything before it, then the turn's round (model calls), then the attempt, then the poll of
/// a 202 answer (0: the attempt's POST itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Step {
    pub gen: u32,
    pub round: u32,
    pub attempt: u32,
    pub poll: u32,
}

impl Step {
    /// Where every execution starts: round 0, attempt 1, no poll.
    pub const FIRST: Step = Step { gen: 0, round: 0, attempt: 1, poll: 0 };

    /// The step after a failed attempt.
    pub fn next_attempt(self) -> Step {
        Step { attempt: self.attempt + 1, poll: 0, ..self }
    }

    /// The step after a poll that was still pending (or the attempt's 202).
    pub fn next_poll(self) -> Step {
        Step { poll: self.poll + 1, ..self }
    }

    /// A turn's next model call.
    pub fn next_round(self) -> Step {
        Step { round: self.round + 1, attempt: 1, poll: 0, ..self }
    }

    /// The first step of the next generation (an operator's retry of the dead letter), at `round`.
    pub fn replayed(self, round: u32) -> Step {
        Step { gen: self.gen + 1, round, attempt: 1, poll: 0 }
    }
}

/// What a transition of the record still owes once it is written: until it is done, the record
/// keeps it, and a copy of an earlier step that arrives meanwhile carries it out instead of
/// running (a worker may have died between the write and the publish).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "owed", rename_all = "snake_case")]
pub enum Owed {
    /// The job's next delivery (a retry, a poll): published to the delay queue that fits it.
    Next { envelope: Box<Envelope> },
    /// The dead letter decided for the job: its aftermath, its durable record and its status.
    Settle { verdict: Verdict },
    /// A turn's tool call that succeeded: its turn is told the result.
    Parent,
    /// A turn's round of tool calls: the calls without an outcome are published.
    TurnCalls,
    /// A turn's round whose calls all ended: its next step is published.
    TurnNext,
    /// A turn's finish: the session given back, subscribers told, the next turn woken, the record
    /// marked succeeded.
    TurnFinish,
    /// A finished turn's `message_complete` and `done` events.
    Announce,
}

impl Owed {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an owed step serialises")
    }

    /// Reads what a record owes; `None` for nothing (an empty field) or a form this build does not
    /// know (a newer fleet's: left to it).
    pub fn parse(raw: &str) -> Option<Owed> {
        if raw.is_empty() {
            return None;
        }
        serde_json::from_str(raw).ok()
    }

    /// The `fleet_duplicate_deliveries_total`-style label of what a copy carried out.
    pub fn label(&self) -> &'static str {
        match self {
            Owed::Next { .. } => "next",
            Owed::Settle { .. } => "settle",
            Owed::Parent => "parent",
            Owed::TurnCalls => "turn_calls",
            Owed::TurnNext => "turn_next",
            Owed::TurnFinish => "turn_finish",
            Owed::Announce => "announce",
        }
    }
}

/// What the claim found for a delivery (the record's and the claim's states, decided by one
/// script): run it, or why not.
#[derive(Debug, Clone, PartialEq)]
pub enum Claimed {
    /// This delivery is the record's step: it holds the claim with this fencing token.
    Held { token: u64 },
    /// An earlier step, or the execution has ended (dead-lettered, failed): only acked.
    Copy,
    /// An earlier step while the record still owes something: carry it out (not the job).
    Owed { owed: Owed, result: Option<Value> },
    /// The execution succeeded; its result.
    Done { result: Value },
    /// This step is running under another claim for this long: try again then.
    Busy { remaining_ms: u64 },
    /// The execution was cancelled before this step ran.
    Cancelled,
    /// No record (one written before the record moved beside its claim, or none at all).
    Missing,
}

impl Envelope {
    /// Which step of its execution's life this delivery stands for.
    pub fn step(&self) -> Step {
        let round = match &self.job {
            crate::envelope::Job::Turn(step) => step.round,
            crate::envelope::Job::ToolCall(_) | crate::envelope::Job::Webhook(_) => 0,
        };
        let poll = self.poll.as_ref().map_or(0, |p| p.seq.max(1));
        Step { gen: self.gen, round, attempt: self.attempt, poll }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{DeadLetterReason, Job, ToolCallJob};

    #[test]
    fn steps_order_by_generation_round_attempt_then_poll() {
        let s = Step::FIRST;
        assert!(s.next_poll() > s && s.next_attempt() > s.next_poll().next_poll());
        assert!(s.next_round() > s.next_attempt().next_attempt());
        assert!(s.replayed(0) > s.next_round().next_attempt());
        assert_eq!(s.next_attempt().next_poll().next_attempt(), Step { attempt: 3, ..s });
        assert_eq!(s.next_round().next_attempt().replayed(1), Step { gen: 1, round: 1, attempt: 1, poll: 0 });
    }

    #[test]
    fn an_envelope_says_its_step() {
        let call = Job::ToolCall(ToolCallJob {
            tool_name: "t".into(),
            parameters: serde_json::json!({}),
            room_id: None,
            assistant_id: None,
            parent: None,
        });
        let mut e = Envelope::new("exec_a".into(), call, 1);
        assert_eq!(e.step(), Step::FIRST);
        e.attempt = 2;
        e.gen = 1;
        e.poll = Some(crate::envelope::PollState { status_url: "u".into(), deadline_ms: 0, started_at_ms: 0, seq: 3 });
        assert_eq!(e.step(), Step { gen: 1, round: 0, attempt: 2, poll: 3 });
        // A poll written before polls were numbered counts as the first.
        e.poll.as_mut().unwrap().seq = 0;
        assert_eq!(e.step().poll, 1);
    }

    #[test]
    fn owed_steps_round_trip_and_unknown_forms_are_left_alone() {
        let verdict = Verdict { reason: DeadLetterReason::Exhausted, error: "HTTP 500".into() };
        for owed in
            [Owed::Settle { verdict }, Owed::Parent, Owed::TurnCalls, Owed::TurnNext, Owed::TurnFinish, Owed::Announce]
        {
            assert_eq!(Owed::parse(&owed.to_json()), Some(owed));
        }
        assert_eq!(Owed::parse(""), None);
        assert_eq!(Owed::parse(r#"{"owed":"something_newer"}"#), None);
    }
}
