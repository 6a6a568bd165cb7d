//! Dead-letter operations shared by the API and `fleetctl`: retry (redrive) and delete, by filter,
//! at a bounded rate. A message leaves the dead-letter queue only after what replaces it is
//! confirmed: the redriven job's publish is confirmed before the dead letter is acked.

use std::time::Duration;

use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::Connection;
use serde::Serialize;

use fleet_protocol::deadletter::{DeadLetterFilter, DeadLetterRecord};
use fleet_protocol::envelope::{Envelope, CONTENT_TYPE};
use fleet_protocol::execution::ExecutionStatus;
use fleet_protocol::topology::Topology;

use crate::broker::{BrokerError, Publisher};
use crate::now_ms;
use crate::store::Store;

/// Dead letters held unacked at once while a sweep looks for matches.
const SWEEP_PREFETCH: u16 = 500;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Back onto the work queue with a fresh attempt count and the same execution id.
    Retry,
    Delete,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    /// Dead letters looked at.
    pub scanned: u64,
    /// Matched the filter.
    pub matched: u64,
    /// Retried or deleted.
    pub done: u64,
    /// Matched but cannot be retried (poison: there is no job to replay).
    pub not_replayable: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error("broker error: {0}")]
    Amqp(#[from] lapin::Error),
}

/// Goes once through the dead-letter queue applying `action` to records matching `filter`, at most
/// `limit` of them, no faster than `per_second`. Non-matching messages are held unacked during the
/// pass and return to the queue when its channel closes.
#[allow(clippy::too_many_arguments)]
pub async fn sweep(
    connection: &Connection,
    publisher: &Publisher,
    topology: &Topology,
    store: &Store,
    filter: &DeadLetterFilter,
    action: Action,
    limit: Option<u64>,
    per_second: Option<f64>,
) -> Result<SweepReport, SweepError> {
    let channel = connection.create_channel().await?;
    let queue = topology.dead_letter_queue();
    let depth = channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions { passive: true, ..Default::default() },
            FieldTable::default(),
        )
        .await?
        .message_count() as u64;
    let mut report = SweepReport::default();
    if depth == 0 {
        let _ = channel.close(200, "sweep done".into()).await;
        return Ok(report);
    }
    channel.basic_qos(SWEEP_PREFETCH, BasicQosOptions::default()).await?;
    let mut consumer = channel
        .basic_consume(queue.as_str().into(), "".into(), BasicConsumeOptions::default(), FieldTable::default())
        .await?;
    let pause = per_second.filter(|r| *r > 0.0).map(|r| Duration::from_secs_f64(1.0 / r));
    let mut held = Vec::new();
    while report.scanned < depth && limit.is_none_or(|l| report.done < l) {
        let next = tokio::time::timeout(Duration::from_secs(2), consumer.next()).await;
        let Ok(Some(Ok(delivery))) = next else { break };
        report.scanned += 1;
        let Some(record) = read_dead_letter(&delivery.data) else {
            held.push(delivery);
            continue;
        };
        if !filter.matches(&record) {
            held.push(delivery);
            continue;
        }
        report.matched += 1;
        let id = record.execution_id.clone().unwrap_or_default();
        match action {
            Action::Delete => {
                delivery.ack(BasicAckOptions::default()).await?;
                let _ = store.delete_dead_letter(&id).await;
                report.done += 1;
            }
            Action::Retry => {
                let envelope = record.job.as_ref().and_then(|job| {
                    let bytes = serde_json::to_vec(job).ok()?;
                    Envelope::decode(&bytes, Some(CONTENT_TYPE)).ok()
                });
                let Some(envelope) = envelope else {
                    report.not_replayable += 1;
                    held.push(delivery);
                    continue;
                };
                let fresh = Envelope {
                    attempt: 1,
                    first_attempt_at_ms: None,
                    not_before_ms: None,
                    poll: None,
                    enqueued_at_ms: now_ms(),
                    ..envelope
                };
                let _ = store.set_status(&id, ExecutionStatus::Queued, None, now_ms(), None).await;
                publisher.publish_job(topology, &fresh, FieldTable::default()).await?;
                delivery.ack(BasicAckOptions::default()).await?;
                let _ = store.delete_dead_letter(&id).await;
                report.done += 1;
            }
        }
        if let Some(p) = pause {
            tokio::time::sleep(p).await;
        }
    }
    drop(held);
    let _ = channel.close(200, "sweep done".into()).await;
    Ok(report)
}

/// A dead letter's record: the worker's record, or (for a job the broker itself dead-lettered after
/// too many redeliveries) one made from the job envelope.
fn read_dead_letter(body: &[u8]) -> Option<DeadLetterRecord> {
    if let Ok(record) = serde_json::from_slice::<DeadLetterRecord>(body) {
        return Some(record);
    }
    let envelope = Envelope::decode(body, Some(CONTENT_TYPE)).ok()?;
    let job = serde_json::to_value(&envelope).ok();
    let kind = Some(envelope.kind().as_str().to_string());
    let (tool_name, assistant_id, room_id) = match envelope.job {
        fleet_protocol::envelope::Job::ToolCall(call) => (Some(call.tool_name), call.assistant_id, call.room_id),
        fleet_protocol::envelope::Job::Webhook(_) => (None, None, None),
        fleet_protocol::envelope::Job::Turn(t) => (None, None, Some(t.session_id)),
    };
    Some(DeadLetterRecord {
        execution_id: Some(envelope.execution_id),
        kind,
        tool_name,
        assistant_id,
        room_id,
        attempts: envelope.attempt,
        last_error: "redelivered too often (the broker's delivery limit)".into(),
        first_attempt_at: None,
        last_attempt_at: None,
        reason: fleet_protocol::deadletter::DeadLetterReason::DeliveryLimit,
        dead_lettered_at: fleet_protocol::timefmt::rfc3339_from_millis(now_ms()),
        history: vec![],
        job,
        raw_body: None,
    })
}
