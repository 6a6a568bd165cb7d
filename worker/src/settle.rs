//! How a job's delivery ends: every job kind returns an `Outcome`, and `Processor::settle` carries
//! it out — the one retry path (record, release, delay queue) and the one dead-letter path
//! (record, aftermath for the job's turn or session, durable dead letter, status) — before the
//! delivery is acked or requeued.

use std::time::Duration;

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;

use fleet_platform::broker::{BrokerError, Publisher};
use fleet_platform::dead_letters;
use fleet_platform::now_ms;
use fleet_platform::telemetry;
use fleet_protocol::deadletter::{DeadLetterReason, DeadLetterRecord, RECORD_MESSAGE_TYPE};
use fleet_protocol::envelope::{Envelope, Verdict, CONTENT_TYPE};
use fleet_protocol::execution::{AttemptOutcome, AttemptRecord, ExecutionStatus};
use fleet_protocol::retry::RetryDecision;

use crate::process::Processor;

/// The claim a job's work runs under: which claim key, its token, and the fence its record and
/// state writes carry (the token itself, or the turn's `step_fence`).
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub claim_id: String,
    pub token: u64,
    pub fence: u64,
}

/// An attempt that failed: `settle` decides between another attempt and the dead letter.
pub(crate) struct Failure {
    pub record: AttemptRecord,
    pub error: String,
    pub retry_after: Option<Duration>,
    pub permanent: bool,
    pub held: Held,
    /// When the attempt started (ms), for `first_attempt_at`.
    pub started_ms: i64,
}

/// How a job's delivery ends.
pub(crate) enum Outcome {
    /// Its work is done (or was already): ack. The label is the `jobs_finished` outcome.
    Done(&'static str),
    Failed(Failure),
    /// Give up on the job. `record` is the last attempt, not yet recorded; `code` names the
    /// failure in a turn's `error` event.
    DeadLetter {
        reason: DeadLetterReason,
        error: String,
        record: Option<AttemptRecord>,
        held: Option<Held>,
        code: Option<&'static str>,
    },
    /// A newer claim owns the job: nothing more is written or scheduled.
    Fenced,
    /// Hold the job in a delay queue without spending an attempt.
    Parked(Duration),
    /// Return it to its queue now (a write it depends on failed).
    Requeue,
}

/// What happens to the delivery itself.
pub(crate) enum Settle {
    Ack,
    Requeue,
}

impl Processor {
    pub(crate) async fn settle(&self, publisher: &Publisher, envelope: &Envelope, outcome: Outcome) -> Settle {
        match outcome {
            Outcome::Done(label) => {
                self.finished(envelope, label);
                if label == "success" {
                    self.observe_latency(envelope, "success");
                }
                Settle::Ack
            }
            Outcome::Failed(failure) => self.after_failure(publisher, envelope, failure).await,
            Outcome::DeadLetter { reason, error, record, held, code } => {
                self.dead_letter(publisher, envelope, Verdict { reason, error }, record, held, code).await
            }
            Outcome::Fenced => {
                tracing::warn!(execution_id = %envelope.execution_id, "a newer claim fenced this worker off; its writes are dropped");
                self.finished(envelope, "fenced");
                Settle::Ack
            }
            Outcome::Parked(remaining) => {
                self.finished(envelope, "deferred");
                self.park(publisher, envelope, remaining).await
            }
            Outcome::Requeue => Settle::Requeue,
        }
    }

    async fn after_failure(&self, publisher: &Publisher, envelope: &Envelope, mut failure: Failure) -> Settle {
        let decision = if failure.permanent {
            RetryDecision::Exhausted
        } else {
            // The tool's or webhook's own schedule, else the fleet's default.
            self.retry_decision(envelope, failure.retry_after).await
        };
        match decision {
            RetryDecision::Retry { next_attempt, wait, step } => {
                self.retry_later(publisher, envelope, failure, next_attempt, wait, step).await
            }
            RetryDecision::Exhausted => {
                let (reason, outcome) = if failure.permanent {
                    (DeadLetterReason::Permanent, AttemptOutcome::Permanent)
                } else {
                    (DeadLetterReason::Exhausted, AttemptOutcome::Exhausted)
                };
                failure.record.outcome = outcome;
                let verdict = Verdict { reason, error: failure.error };
                self.dead_letter(publisher, envelope, verdict, Some(failure.record), Some(failure.held), None).await
            }
        }
    }

    /// Attempt n+1, held by the broker: the attempt is recorded and the claim released first, so
    /// the next attempt can claim at once; the delivery is acked once the retry is confirmed.
    async fn retry_later(
        &self,
        publisher: &Publisher,
        envelope: &Envelope,
        mut failure: Failure,
        next_attempt: u32,
        wait: Duration,
        step: usize,
    ) -> Settle {
        let id = &envelope.execution_id;
        crate::jobs::before_retry(self, envelope, &failure.error).await;
        failure.record.outcome = AttemptOutcome::Retry;
        let held = &failure.held;
        let recorded = self
            .store
            .record_attempt(id, &failure.record, ExecutionStatus::Retrying, None, now_ms(), Some(held.fence))
            .await;
        if let Ok(false) = recorded {
            return self.settle_fenced(envelope);
        }
        if !self.release(held, "released").await {
            return self.settle_fenced(envelope);
        }
        let next = Envelope {
            attempt: next_attempt,
            first_attempt_at_ms: Some(envelope.first_attempt_at_ms.unwrap_or(failure.started_ms)),
            not_before_ms: Some(now_ms() + wait.as_millis() as i64),
            poll: None,
            ..envelope.clone()
        };
        let queue = self.config.common.topology.delay_queue(envelope.kind(), step);
        match publisher.publish_delayed(&queue, &next, trace_headers()).await {
            Ok(()) => {
                let attempt = next_attempt.to_string();
                self.metrics.retries_scheduled.with_label_values(&[envelope.kind().as_str(), &attempt]).inc();
                self.finished(envelope, "retry");
                Settle::Ack
            }
            Err(e) => {
                tracing::warn!(execution_id = %id, error = %e, "cannot schedule the retry; requeued");
                Settle::Requeue
            }
        }
    }

    /// The one way a job becomes a dead letter: its last attempt recorded, its aftermath (failure
    /// events, the parent turn told, a turn's session freed), the dead letter made durable, then
    /// its status. If the aftermath fails, the job comes back carrying its verdict and only settles.
    async fn dead_letter(
        &self,
        publisher: &Publisher,
        envelope: &Envelope,
        verdict: Verdict,
        record: Option<AttemptRecord>,
        held: Option<Held>,
        code: Option<&'static str>,
    ) -> Settle {
        let id = &envelope.execution_id;
        let fence = held.as_ref().map(|h| h.fence);
        if let Some(record) = &record {
            let recorded = self.store.record_attempt(id, record, ExecutionStatus::Running, None, now_ms(), fence).await;
            if let Ok(false) = recorded {
                return self.settle_fenced(envelope);
            }
        }
        let history = match self.store.get_execution(id).await {
            Ok(Some(view)) => view.attempts,
            _ => record.into_iter().collect(),
        };
        let dead = DeadLetterRecord::for_job(envelope, verdict.reason, &verdict.error, history, now_ms());
        if let Err(e) = crate::jobs::aftermath(self, publisher, envelope, &dead, code).await {
            tracing::warn!(execution_id = %id, error = %e, "the dead letter's aftermath failed; it settles again later");
            return self.park_decided(publisher, envelope, verdict).await;
        }
        if let Settle::Requeue = self.publish_dead_letter(publisher, id, &dead, envelope.kind().as_str()).await {
            return self.park_decided(publisher, envelope, verdict).await;
        }
        let _ = self.store.set_status(id, ExecutionStatus::DeadLettered, None, now_ms(), fence).await;
        if let Some(held) = &held {
            // Not `done`: a replay of the dead letter claims the job again.
            let _ = self.release(held, "dead_lettered").await;
        }
        self.finished(envelope, dead_letter_label(verdict.reason));
        self.observe_latency(envelope, "dead_letter");
        Settle::Ack
    }

    /// Parks the job with its verdict, so its next delivery carries the dead letter out again
    /// without running anything; requeued if even that fails.
    async fn park_decided(&self, publisher: &Publisher, envelope: &Envelope, verdict: Verdict) -> Settle {
        let decided = Envelope { settle: Some(verdict), ..envelope.clone() };
        self.park(publisher, &decided, self.config.common.retry.delays()[0]).await
    }

    fn settle_fenced(&self, envelope: &Envelope) -> Settle {
        tracing::warn!(execution_id = %envelope.execution_id, "a newer claim fenced this worker off; its writes are dropped");
        self.finished(envelope, "fenced");
        Settle::Ack
    }

    /// Gives the claim back; `false` means a newer claim fenced this one off. A Redis error counts
    /// as released: the lease expires by itself.
    pub(crate) async fn release(&self, held: &Held, state: &str) -> bool {
        !matches!(self.store.release(&held.claim_id, held.token, state).await, Ok(false))
    }

    pub(crate) fn finished(&self, envelope: &Envelope, outcome: &str) {
        self.metrics.jobs_finished.with_label_values(&[envelope.kind().as_str(), outcome]).inc();
    }

    pub(crate) fn observe_latency(&self, envelope: &Envelope, outcome: &str) {
        let secs = (now_ms() - envelope.enqueued_at_ms).max(0) as f64 / 1000.0;
        self.metrics.job_latency.with_label_values(&[envelope.kind().as_str(), outcome]).observe(secs);
    }

    /// Holds a job in the delay queue that fits `remaining` without spending an attempt: the
    /// longest of the ladder (retry delays and park queues, 250 ms to 1 h) that does not overshoot;
    /// on return it is parked again until its `not_before_ms` is due.
    pub(crate) async fn park(&self, publisher: &Publisher, envelope: &Envelope, remaining: Duration) -> Settle {
        let retry = &self.config.common.retry;
        let step = retry.park_step(remaining);
        let held = Envelope { not_before_ms: Some(now_ms() + remaining.as_millis() as i64), ..envelope.clone() };
        let queue = self.config.common.topology.delay_queue(envelope.kind(), step);
        match publisher.publish_delayed(&queue, &held, trace_headers()).await {
            Ok(()) => Settle::Ack,
            Err(e) => {
                tracing::warn!(execution_id = %envelope.execution_id, error = %e, "cannot park job; requeued");
                Settle::Requeue
            }
        }
    }

    /// Makes the dead letter durable; only then may the job be acked. Redis is its store of record;
    /// the dead-letter queue gets a copy too, marked as stored (operators' tap; the dispatcher's
    /// drain acks it). With Redis down, the queue's confirmed copy is what makes it durable, and the
    /// drain stores it once Redis is back.
    pub(crate) async fn publish_dead_letter(
        &self,
        publisher: &Publisher,
        id: &str,
        record: &DeadLetterRecord,
        kind: &str,
    ) -> Settle {
        let stored = match self.store.save_dead_letter(id, record, now_ms()).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(dead_letter_id = %id, error = %e, "dead letter not stored in Redis; queued for the drain");
                false
            }
        };
        let body = serde_json::to_vec(record).expect("a record serialises");
        let mut headers = FieldTable::default();
        headers.insert("x-fleet-dead-letter-reason".into(), long_string(record.reason.as_str()));
        headers.insert(dead_letters::STORED_HEADER.into(), AMQPValue::Boolean(stored));
        let properties = BasicProperties::default()
            .with_content_type(CONTENT_TYPE.into())
            .with_delivery_mode(2)
            .with_message_id(ShortString::from(id))
            .with_type(RECORD_MESSAGE_TYPE.into())
            .with_headers(headers);
        let published: Result<(), BrokerError> =
            publisher.publish(&self.config.common.topology.dead_letter_exchange(), "", &body, properties).await;
        match published {
            Err(e) if !stored => {
                tracing::warn!(dead_letter_id = %id, error = %e, "cannot publish dead letter; requeued");
                return Settle::Requeue;
            }
            Err(e) => tracing::debug!(dead_letter_id = %id, error = %e, "dead letter stored; its queue copy failed"),
            Ok(()) => {}
        }
        self.metrics.dead_letters.with_label_values(&[kind, record.reason.as_str()]).inc();
        Settle::Ack
    }
}

/// The `jobs_finished` outcome of a dead letter.
fn dead_letter_label(reason: DeadLetterReason) -> &'static str {
    match reason {
        DeadLetterReason::Permanent => "permanent",
        DeadLetterReason::Exhausted => "dead_letter",
        DeadLetterReason::Poison => "poison",
        DeadLetterReason::DeliveryLimit => "delivery_limit",
    }
}

fn long_string(text: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(text.as_bytes().to_vec()))
}

/// AMQP headers carrying the current span's trace context, so a retry continues the trace.
pub(crate) fn trace_headers() -> FieldTable {
    telemetry::amqp_headers(&tracing::Span::current())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dead_letter_reason_has_its_own_label() {
        let reasons = [
            DeadLetterReason::Permanent,
            DeadLetterReason::Exhausted,
            DeadLetterReason::Poison,
            DeadLetterReason::DeliveryLimit,
        ];
        let labels: std::collections::HashSet<_> = reasons.iter().map(|r| dead_letter_label(*r)).collect();
        assert_eq!(labels.len(), reasons.len());
    }
}
