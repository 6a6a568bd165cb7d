//! What happens to one delivery: poison check, delivery limit, hold check, then the job kind's
//! pipeline (`jobs`) produces an `Outcome` that `settle` carries out, and only then the ack.

use std::sync::Arc;

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::types::{AMQPValue, FieldTable};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use fleet_platform::broker::Publisher;
use fleet_platform::metrics::Metrics;
use fleet_platform::now_ms;
use fleet_platform::store::Store;
use fleet_platform::telemetry;
use fleet_protocol::deadletter::{excerpt_raw_body, DeadLetterReason, DeadLetterRecord};
use fleet_protocol::envelope::{self, is_valid_execution_id, Envelope, Job, PoisonReason};
use fleet_protocol::retry::remaining_hold;
use fleet_protocol::sanitize::sanitize_error;
use fleet_protocol::timefmt::rfc3339_from_millis;

use crate::settle::{Outcome, Settle};
use crate::WorkerConfig;

/// Shared by every job task of a worker.
pub struct Processor {
    pub config: WorkerConfig,
    pub store: Store,
    pub metrics: Metrics,
    pub client: crate::http::CallbackClient,
    pub llm: crate::llm::LlmClients,
    pub targets: crate::registry::TargetCache,
    /// Tools' `max_concurrency` and `rate_limit`, cached like the targets.
    pub(crate) limits: crate::jobs::limits::LimitsCache,
}

impl Processor {
    /// Handles one delivery to the end, settling it on `publisher`'s connection.
    pub async fn handle(self: Arc<Self>, delivery: Delivery, publisher: Publisher) {
        let settle = self.process(&delivery, &publisher).await;
        let result = match settle {
            Settle::Ack => delivery.ack(BasicAckOptions::default()).await,
            Settle::Requeue => delivery.nack(BasicNackOptions { requeue: true, ..Default::default() }).await,
        };
        if let Err(e) = result {
            // The channel is gone; the broker returns the message to the queue by itself.
            tracing::warn!(error = %e, "could not settle delivery; it will be redelivered");
        }
    }

    async fn process(&self, delivery: &Delivery, publisher: &Publisher) -> Settle {
        let content_type = delivery.properties.content_type().as_ref().map(|s| s.as_str());
        let envelope = match Envelope::decode(&delivery.data, content_type) {
            Ok(e) => e,
            Err(reason) => return self.dead_letter_poison(delivery, reason, publisher).await,
        };
        let span = job_span(self, &envelope);
        let _ = span.set_parent(telemetry::from_amqp_headers(delivery.properties.headers().as_ref()));
        let deliveries = delivery_count(delivery.properties.headers().as_ref());
        async {
            let outcome = self.outcome(publisher, &envelope, deliveries).await;
            // Boxed: settling is larger than a pipeline's wait, and only one stage lives at a time.
            Box::pin(self.settle(publisher, &envelope, outcome)).await
        }
        .instrument(span)
        .await
    }

    /// The job's pipeline, unless its end is already decided (a verdict it carries, or too many
    /// deliveries: a job that keeps killing its worker must not run again) or it must wait.
    async fn outcome(&self, publisher: &Publisher, envelope: &Envelope, deliveries: u64) -> Outcome {
        let verdict = envelope.settle.clone().or_else(|| {
            envelope::delivery_limit_reached(deliveries, self.config.max_deliveries).then(|| envelope::Verdict {
                reason: DeadLetterReason::DeliveryLimit,
                error: envelope::delivery_limit_error(deliveries),
            })
        });
        if let Some(verdict) = verdict {
            tracing::warn!(
                reason = verdict.reason.as_str(),
                "the job's end is decided; it is dead-lettered without running"
            );
            let (reason, error) = (verdict.reason, verdict.error);
            return Outcome::DeadLetter { reason, error, record: None, held: None, code: None };
        }
        if let Some(remaining) = remaining_hold(envelope.not_before_ms, now_ms()) {
            return Outcome::Parked(remaining);
        }
        let kind = envelope.kind().as_str();
        let in_flight = self.metrics.jobs_in_flight.with_label_values(&[kind]);
        in_flight.inc();
        let outcome = crate::jobs::run(self, publisher, envelope).await;
        in_flight.dec();
        outcome
    }

    async fn dead_letter_poison(&self, delivery: &Delivery, reason: PoisonReason, publisher: &Publisher) -> Settle {
        let message_id = delivery.properties.message_id().as_ref().map(|s| s.to_string());
        let id = message_id.filter(|m| is_valid_execution_id(m)).unwrap_or_else(|| format!("poison_{}", uuid_like()));
        tracing::warn!(dead_letter_id = %id, reason = %reason, "poison message dead-lettered");
        let record = DeadLetterRecord {
            execution_id: Some(id.clone()),
            kind: None,
            tool_name: None,
            assistant_id: None,
            room_id: None,
            attempts: 0,
            last_error: sanitize_error(&reason.to_string()),
            first_attempt_at: None,
            last_attempt_at: None,
            reason: DeadLetterReason::Poison,
            dead_lettered_at: rfc3339_from_millis(now_ms()),
            history: vec![],
            job: None,
            raw_body: Some(excerpt_raw_body(&delivery.data)),
        };
        let settle = self.publish_dead_letter(publisher, &id, &record, "unknown").await;
        if matches!(settle, Settle::Ack) {
            self.metrics.jobs_finished.with_label_values(&["unknown", "poison"]).inc();
        }
        settle
    }
}

/// The job's span continues the publisher's trace (W3C context from the AMQP headers), and every
/// log line of the job carries its execution id, attempt and what it is for.
fn job_span(processor: &Processor, envelope: &Envelope) -> tracing::Span {
    let queue = processor.config.common.topology.work_queue(envelope.kind());
    let span = tracing::info_span!(
        "job",
        otel.name = format!("process {queue}"),
        otel.kind = "consumer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "process",
        messaging.destination.name = %queue,
        messaging.message.id = %envelope.execution_id,
        execution_id = %envelope.execution_id,
        attempt = envelope.attempt,
        kind = envelope.kind().as_str(),
        tool_name = tracing::field::Empty,
        webhook_id = tracing::field::Empty,
        session_id = tracing::field::Empty,
    );
    match &envelope.job {
        Job::ToolCall(call) => span.record("tool_name", call.tool_name.as_str()),
        Job::Webhook(hook) => span.record("webhook_id", hook.webhook_id.as_str()),
        Job::Turn(step) => span.record("session_id", step.session_id.as_str()),
    };
    span
}

/// How many times the broker delivered this message before (quorum queues' `x-delivery-count`).
fn delivery_count(headers: Option<&FieldTable>) -> u64 {
    let value = headers.and_then(|h| h.inner().get("x-delivery-count").cloned());
    match value {
        Some(AMQPValue::LongLongInt(n)) => n.max(0) as u64,
        Some(AMQPValue::LongInt(n)) => n.max(0) as u64,
        Some(AMQPValue::LongUInt(n)) => u64::from(n),
        Some(AMQPValue::ShortInt(n)) => n.max(0) as u64,
        Some(AMQPValue::ShortUInt(n)) => u64::from(n),
        Some(AMQPValue::ShortShortInt(n)) => n.max(0) as u64,
        Some(AMQPValue::ShortShortUInt(n)) => u64::from(n),
        Some(AMQPValue::Timestamp(n)) => n,
        _ => 0,
    }
}

fn uuid_like() -> String {
    fleet_protocol::new_execution_id().trim_start_matches("exec_").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delivery_count_reads_any_integer_header() {
        assert_eq!(delivery_count(None), 0);
        for value in [AMQPValue::LongLongInt(7), AMQPValue::LongInt(7), AMQPValue::ShortShortUInt(7)] {
            let mut headers = FieldTable::default();
            headers.insert("x-delivery-count".into(), value);
            assert_eq!(delivery_count(Some(&headers)), 7);
        }
    }
}
