//! What happens to one delivery: poison check, decided end or delivery limit, hold check, then the
//! job kind's pipeline (`jobs`) produces an `Outcome` that `settle` carries out, and only then the
//! ack. Nothing below this module acks.

use std::sync::Arc;

use lapin::message::Delivery;
use lapin::types::{AMQPValue, FieldTable};
use tracing::Instrument;

use fleet_platform::acks::BatchAcks;
use fleet_platform::broker::Publisher;
use fleet_platform::now_ms;
use fleet_platform::telemetry;
use fleet_protocol::dead_letters::{excerpt_raw_body, DeadLetterReason, DeadLetterRecord};
use fleet_protocol::envelope::{self, is_valid_execution_id, Envelope, Job, PoisonReason};
use fleet_protocol::retry::remaining_hold;
use fleet_protocol::sanitize::sanitize_error;
use fleet_protocol::timefmt::rfc3339_from_millis;

use crate::context::{Cx, WorkerParts};
use crate::outcome::{Outcome, Settle};

/// Handles one delivery to the end, settling it on `publisher`'s connection. Its ack joins its
/// channel's next batch (`acks`), sent once every delivery before it on the channel settled too.
pub(crate) async fn handle(parts: Arc<WorkerParts>, delivery: Delivery, publisher: Publisher, acks: Arc<BatchAcks>) {
    let cx = parts.cx(&publisher);
    let tag = delivery.delivery_tag;
    let result = match process(&cx, &delivery).await {
        Settle::Ack => {
            acks.ack(tag);
            Ok(())
        }
        Settle::Requeue => acks.requeue(tag).await,
        // The channel is gone: the broker returns the delivery by itself.
        Settle::Abandon => {
            acks.abandon(tag);
            Ok(())
        }
    };
    if let Err(e) = result {
        // The channel is gone; the broker returns the message to the queue by itself.
        tracing::warn!(error = %e, "could not settle delivery; it will be redelivered");
    }
}

async fn process(cx: &Cx<'_>, delivery: &Delivery) -> Settle {
    let content_type = delivery.properties.content_type().as_ref().map(|s| s.as_str());
    let envelope = match Envelope::decode(&delivery.data, content_type) {
        Ok(e) => e,
        // Boxed as `jobs::run` boxes a job: a poison message is dispatched here instead of a job,
        // and its dead letter's future need not size every job's task.
        Err(reason) => return Box::pin(dead_letter_poison(cx, delivery, reason)).await,
    };
    let span = job_span(cx, &envelope, delivery.routing_key.as_str());
    telemetry::set_parent(&span, telemetry::from_amqp_headers(delivery.properties.headers().as_ref()));
    let deliveries = delivery_count(delivery.properties.headers().as_ref());
    // A job past its delivery limit carries its verdict from here on, also where it is parked.
    let envelope = decided(cx, envelope, deliveries);
    // `settle` boxes its own future (it may call itself), so it does not size every job's task.
    async {
        let outcome = outcome(cx, &envelope).await;
        crate::settle::settle(cx, &envelope, outcome).await
    }
    .instrument(span)
    .await
}

/// The envelope, with the verdict of a job delivered too many times: one that keeps killing its
/// worker must not run again.
fn decided(cx: &Cx<'_>, envelope: Envelope, deliveries: u64) -> Envelope {
    if envelope.settle.is_some() || !envelope::delivery_limit_reached(deliveries, cx.config.max_deliveries) {
        return envelope;
    }
    let verdict = envelope::Verdict {
        reason: DeadLetterReason::DeliveryLimit,
        error: envelope::delivery_limit_error(deliveries),
    };
    Envelope { settle: Some(verdict), ..envelope }
}

/// The job's pipeline, unless its end is already decided (the verdict it carries) or it must wait.
async fn outcome(cx: &Cx<'_>, envelope: &Envelope) -> Outcome {
    if let Some(verdict) = envelope.settle.clone() {
        return crate::jobs::decided(cx, envelope, verdict).await;
    }
    if let Some(remaining) = remaining_hold(envelope.not_before_ms, now_ms()) {
        return Outcome::Parked(remaining);
    }
    let kind = envelope.kind().as_str();
    cx.pickups.note(kind, envelope.not_before_ms.unwrap_or(0).max(envelope.enqueued_at_ms));
    let in_flight = cx.metrics.jobs_in_flight.with_label_values(&[kind]);
    in_flight.inc();
    // `jobs::run` boxes the job's future, sized to its kind.
    let outcome = crate::jobs::run(cx, envelope).await;
    in_flight.dec();
    outcome
}

async fn dead_letter_poison(cx: &Cx<'_>, delivery: &Delivery, reason: PoisonReason) -> Settle {
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
        tenant: None,
    };
    let settle = crate::settle::publish_dead_letter(cx, &id, &record, "unknown").await;
    if settle == Settle::Ack {
        cx.finished("unknown", "poison");
    }
    settle
}

/// The job's span continues the publisher's trace (W3C context from the AMQP headers), and every
/// log line of the job carries its execution id, attempt and what it is for. Its queue is the
/// light lane when the job came by the lane's routing key.
fn job_span(cx: &Cx<'_>, envelope: &Envelope, routing_key: &str) -> tracing::Span {
    let kind = envelope.kind();
    let light = fleet_protocol::topology::is_light_key(kind, routing_key);
    let queue = cx.queue_names.get(kind, light);
    let span = tracing::info_span!(
        "job",
        otel.name = queue.span_name.as_str(),
        otel.kind = "consumer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "process",
        messaging.destination.name = queue.name.as_str(),
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
