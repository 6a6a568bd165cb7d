//! Dead-letter operations shared by the API and `fleetctl`: list, retry (redrive) and delete, one
//! by id or in bulk by filter at a bounded rate, all against the records in Redis (never a sweep of
//! the dead-letter queue), plus the drain that moves what arrives on the dead-letter queue into
//! Redis. A retry removes the record only after the replayed job's publish is confirmed.

use std::time::Duration;

use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use fleet_protocol::dead_letters::{
    record_from_message, DeadLetterFilter, DeadLetterRecord, ListCursor, RECORD_MESSAGE_TYPE,
};
use fleet_protocol::envelope::{DeadLetterReason, Envelope, Job, Verdict, CONTENT_TYPE};
use fleet_protocol::execution::ExecutionStatus;
use fleet_protocol::topology::Topology;
use fleet_protocol::topology::WORK_QUEUE_DELIVERY_LIMIT;

use crate::broker::{BrokerError, BrokerLink, Publisher};
use crate::now_ms;
use crate::store::{Store, StoreError};

/// AMQP header on a dead-letter message whose record the worker already stored in Redis.
pub const STORED_HEADER: &str = "x-fleet-dead-letter-stored";

/// Index entries read per page while a bulk operation scans.
const SCAN_PAGE: usize = 500;

/// Dead letters a purge deletes at once.
const PURGE_AT_ONCE: usize = 16;

/// How long one operation may hold a dead letter's lock (a crashed holder frees it by expiry).
const LOCK_TTL: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Back onto the work queue with a fresh attempt count and the same execution id.
    Retry,
    Delete,
}

/// What a bulk operation on dead letters did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct SweepReport {
    /// Dead letters looked at.
    pub scanned: u64,
    /// Matched the filter.
    pub matched: u64,
    /// Retried or deleted.
    pub done: u64,
    /// Matched but cannot be retried (poison: there is no job to replay).
    pub not_replayable: u64,
    /// Matched but no longer dead-lettered (replayed already, or ended otherwise): not retried.
    pub superseded: u64,
}

/// What happened to one dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LetterOutcome {
    Done,
    NotFound,
    /// Another operation is acting on it right now.
    Busy,
    /// Poison: there is no job to replay.
    NotReplayable,
    /// The execution is not dead-lettered any more: it ended (`succeeded`, … : the stale dead letter
    /// is removed, nothing is retried) or runs again (left alone).
    Superseded(ExecutionStatus),
}

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("broker error: {0}")]
    Amqp(#[from] lapin::Error),
}

/// Where a retry publishes; `None` for operations that only delete.
pub struct Redrive<'a> {
    pub publisher: &'a Publisher,
    pub topology: &'a Topology,
}

/// Retries or deletes one dead letter by id.
pub async fn act_on(
    store: &Store,
    redrive: Option<&Redrive<'_>>,
    id: &str,
    action: Action,
) -> Result<LetterOutcome, SweepError> {
    let holder = fleet_protocol::new_execution_id();
    if !store.dead_letters().lock_dead_letter(id, &holder, LOCK_TTL).await? {
        return Ok(if store.dead_letters().get_dead_letter(id).await?.is_some() {
            LetterOutcome::Busy
        } else {
            LetterOutcome::NotFound
        });
    }
    let outcome = locked(store, redrive, id, action).await;
    // A failed unlock only delays the next operation until the lock expires.
    let _ = store.dead_letters().unlock_dead_letter(id, &holder).await;
    outcome
}

async fn locked(
    store: &Store,
    redrive: Option<&Redrive<'_>>,
    id: &str,
    action: Action,
) -> Result<LetterOutcome, SweepError> {
    let Some(record) = store.dead_letters().get_dead_letter(id).await? else {
        store.dead_letters().forget_dead_letters(&[id.to_string()]).await?;
        return Ok(LetterOutcome::NotFound);
    };
    if action == Action::Delete {
        store.dead_letters().delete_dead_letter(id).await?;
        return Ok(LetterOutcome::Done);
    }
    let (Some(envelope), Some(redrive)) = (replayable(&record), redrive) else {
        return Ok(LetterOutcome::NotReplayable);
    };
    let round = match &envelope.job {
        Job::Turn(step) => step.round,
        Job::ToolCall(_) | Job::Webhook(_) => 0,
    };
    // The execution's next generation: every job from before the dead letter is a copy from now on.
    let gen = match store.executions().replay_execution(id, round).await? {
        Some(gen) => gen,
        None => match store.executions().expected(id).await? {
            // Not dead-lettered: it was replayed already, or runs or ended otherwise. Nothing is
            // retried; a dead letter of an execution that ended is stale, and goes.
            Some(expected) => {
                if expected.status.is_final() {
                    store.dead_letters().delete_dead_letter(id).await?;
                }
                return Ok(LetterOutcome::Superseded(expected.status));
            }
            // The record is gone (older than its retention): it starts again as a new one.
            None => {
                recreate(store, id, &record, &envelope).await?;
                envelope.gen
            }
        },
    };
    let fresh = Envelope { enqueued_at_ms: now_ms(), gen, ..envelope.as_first_attempt() };
    // A turn runs its failed step again: open it and put it back in its session's line.
    let reopened = match &fresh.job {
        Job::Turn(_) => store.sessions().reopen_turn(id).await?,
        Job::ToolCall(_) | Job::Webhook(_) => true,
    };
    if !reopened {
        return Ok(LetterOutcome::NotReplayable);
    }
    // The operator's request is the trace this publish continues.
    let headers = crate::telemetry::amqp_headers(&tracing::Span::current());
    redrive.publisher.publish_job(redrive.topology, &fresh, headers).await?;
    store.dead_letters().delete_dead_letter(id).await?;
    Ok(LetterOutcome::Done)
}

/// A record for a dead letter whose execution's record expired: queued, as it was accepted.
async fn recreate(store: &Store, id: &str, record: &DeadLetterRecord, envelope: &Envelope) -> Result<(), StoreError> {
    let kind = envelope.kind();
    let new = crate::store::NewExecution {
        execution_id: id,
        kind,
        tool_name: record.tool_name.as_deref(),
        room_id: record.room_id.as_deref(),
        assistant_id: record.assistant_id.as_deref(),
        tenant: None,
        now_ms: now_ms(),
        run_at_ms: None,
    };
    store.executions().create_execution(&new, None).await.map(|_| ())
}

/// The job a record replays, if it has one.
fn replayable(record: &DeadLetterRecord) -> Option<Envelope> {
    let bytes = serde_json::to_vec(record.job.as_ref()?).ok()?;
    Envelope::decode(&bytes, Some(CONTENT_TYPE)).ok()
}

/// Applies `action` to every dead letter matching `filter` (at most `limit`, no faster than
/// `per_second`): by id when the filter names ids, else by one newest-first pass over the index.
/// Dead letters added during the pass are newer than where it started and are left alone.
/// Deletes run `PURGE_AT_ONCE` at a time (each is four round trips, and a purge of thousands
/// would otherwise outlast its caller's timeout); retries run one by one, at their pace.
pub async fn apply(
    store: &Store,
    redrive: Option<&Redrive<'_>>,
    filter: &DeadLetterFilter,
    action: Action,
    limit: Option<u64>,
    per_second: Option<f64>,
) -> Result<SweepReport, SweepError> {
    let pause = per_second.filter(|r| *r > 0.0).map(|r| Duration::from_secs_f64(1.0 / r));
    let at_once = match action {
        Action::Retry => 1,
        Action::Delete => PURGE_AT_ONCE,
    };
    let mut report = SweepReport::default();
    let mut cursor: Option<ListCursor> = None;
    loop {
        let page = next_page(store, filter, &mut cursor).await?;
        if page.is_empty() {
            return Ok(report);
        }
        let mut page = page.into_iter().peekable();
        while page.peek().is_some() {
            // Never more at once than the limit leaves, so `done` cannot pass it.
            let room = limit.map_or(at_once, |l| at_once.min(l.saturating_sub(report.done) as usize));
            if room == 0 {
                return Ok(report);
            }
            let mut batch = Vec::with_capacity(room);
            for (id, record) in page.by_ref() {
                report.scanned += 1;
                if record.as_ref().is_some_and(|r| filter.matches(r)) {
                    report.matched += 1;
                    batch.push(id);
                    if batch.len() == room {
                        break;
                    }
                }
            }
            let outcomes = futures::future::join_all(batch.iter().map(|id| act_on(store, redrive, id, action))).await;
            for outcome in outcomes {
                report.count(outcome?);
            }
            if let (Some(p), Action::Retry, false) = (pause, action, batch.is_empty()) {
                tokio::time::sleep(p).await;
            }
        }
        if !filter.execution_ids.is_empty() {
            return Ok(report);
        }
    }
}

impl SweepReport {
    fn count(&mut self, outcome: LetterOutcome) {
        match outcome {
            LetterOutcome::Done => self.done += 1,
            LetterOutcome::NotReplayable => self.not_replayable += 1,
            LetterOutcome::Superseded(_) => self.superseded += 1,
            LetterOutcome::NotFound | LetterOutcome::Busy => {}
        }
    }
}

/// The next page of candidates with their records: the named ids at once, or index entries.
async fn next_page(
    store: &Store,
    filter: &DeadLetterFilter,
    cursor: &mut Option<ListCursor>,
) -> Result<Vec<(String, Option<DeadLetterRecord>)>, SweepError> {
    if !filter.execution_ids.is_empty() {
        let records = store.dead_letters().get_dead_letters(&filter.execution_ids).await?;
        return Ok(filter.execution_ids.iter().cloned().zip(records).collect());
    }
    let entries = store.dead_letters().list_dead_letters(cursor.as_ref(), SCAN_PAGE).await?;
    let Some((last_id, last_at)) = entries.last() else { return Ok(vec![]) };
    *cursor = Some(ListCursor { at_ms: *last_at, id: last_id.clone() });
    let ids: Vec<String> = entries.into_iter().map(|(id, _)| id).collect();
    let records = store.dead_letters().get_dead_letters(&ids).await?;
    let stale: Vec<String> = ids.iter().zip(&records).filter(|(_, r)| r.is_none()).map(|(id, _)| id.clone()).collect();
    store.dead_letters().forget_dead_letters(&stale).await?;
    Ok(ids.into_iter().zip(records).collect())
}

/// One page of the newest-first listing: up to `limit` records matching `filter`, after `cursor`,
/// looking at no more than `budget` index entries. The returned cursor continues the listing
/// (also when the budget ran out before the page filled); `None` means the end.
pub async fn list(
    store: &Store,
    filter: &DeadLetterFilter,
    cursor: Option<ListCursor>,
    limit: usize,
    budget: usize,
) -> Result<(Vec<DeadLetterRecord>, Option<ListCursor>), SweepError> {
    let read = |cursor: Option<ListCursor>, want: usize| async move {
        let entries = store.dead_letters().list_dead_letters(cursor.as_ref(), want).await?;
        let ids: Vec<String> = entries.iter().map(|(id, _)| id.clone()).collect();
        let records = store.dead_letters().get_dead_letters(&ids).await?;
        let page = entries.into_iter().zip(records);
        Ok(page
            .map(|((id, at), record)| (ListCursor { at_ms: at, id }, record.filter(|r| filter.matches(r))))
            .collect())
    };
    Ok(crate::store::scan::newest_first(cursor, limit, budget, SCAN_PAGE, read).await?)
}

/// Moves what arrives on the dead-letter queue into Redis until `cancel`: records the worker
/// already stored are acknowledged; the others (Redis was down when the worker dead-lettered, or
/// the broker dead-lettered a job or a raw body itself) are stored first. The queue so stays
/// short; operators who want a copy of every dead letter bind their own queue to the exchange.
pub async fn drain(
    mut link: BrokerLink,
    topology: Topology,
    store: Store,
    metrics: crate::metrics::Metrics,
    cancel: CancellationToken,
) {
    while let Some(live) = link.wait_live(&cancel).await {
        let outcome = tokio::select! {
            r = drain_once(&live, &topology, &store, &metrics, &cancel) => r,
            _ = link.lost(&live) => Ok(()),
        };
        if let Err(e) = outcome {
            tracing::warn!(error = %e, "dead-letter drain interrupted");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = cancel.cancelled() => return,
        }
    }
}

/// A job the broker dead-lettered itself (it kept losing its worker) goes back to the workers
/// marked as decided, so its dead letter is carried out like any other: record, status, metric,
/// and its turn or session told. Once only: a marked job dead-lettered again is stored as is.
async fn hand_back(publisher: &Publisher, topology: &Topology, body: &[u8], content_type: Option<&str>) -> bool {
    let Ok(envelope) = Envelope::decode(body, content_type) else { return false };
    if envelope.settle.is_some() {
        return false;
    }
    let error = fleet_protocol::envelope::delivery_limit_error(WORK_QUEUE_DELIVERY_LIMIT as u64);
    let decided = Envelope { settle: Some(Verdict { reason: DeadLetterReason::DeliveryLimit, error }), ..envelope };
    match publisher.publish_job(topology, &decided, FieldTable::default()).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(execution_id = %decided.execution_id, error = %e, "cannot hand a dead-lettered job back to the workers; stored as is");
            false
        }
    }
}

async fn drain_once(
    live: &crate::broker::Live,
    topology: &Topology,
    store: &Store,
    metrics: &crate::metrics::Metrics,
    cancel: &CancellationToken,
) -> Result<(), SweepError> {
    let channel = live.connection.create_channel().await?;
    channel.basic_qos(50, BasicQosOptions::default()).await?;
    let queue = topology.dead_letter_queue();
    let mut consumer = channel
        .basic_consume(queue.as_str().into(), "".into(), BasicConsumeOptions::default(), FieldTable::default())
        .await?;
    loop {
        let delivery = tokio::select! {
            d = consumer.next() => d,
            _ = cancel.cancelled() => None,
        };
        let Some(delivery) = delivery.transpose()? else {
            let _ = channel.close(200, "drain done".into()).await;
            return Ok(());
        };
        let stored = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(STORED_HEADER).cloned())
            .is_some_and(|v| matches!(v, AMQPValue::Boolean(true)));
        let content_type = delivery.properties.content_type().as_ref().map(|c| c.to_string());
        let from_worker = delivery.properties.kind().as_ref().is_some_and(|t| t.as_str() == RECORD_MESSAGE_TYPE);
        if !stored
            && !from_worker
            && hand_back(&live.publisher, topology, &delivery.data, content_type.as_deref()).await
        {
            delivery.ack(BasicAckOptions::default()).await?;
            continue;
        }
        if !stored {
            let record = record_from_message(&delivery.data, content_type.as_deref(), now_ms());
            let id = record.execution_id.clone().unwrap_or_default();
            match store.dead_letters().insert_dead_letter(&id, &record, now_ms()).await {
                // Counted here only when no worker counted it (the broker dead-lettered it itself).
                Ok(true) if !from_worker => {
                    let kind = record.kind.as_deref().unwrap_or("unknown");
                    metrics.dead_letters.with_label_values(&[kind, record.reason.as_str()]).inc();
                }
                Ok(_) => {}
                Err(e) => {
                    // Redis is down: the message stays on the queue until it can be stored.
                    delivery.nack(BasicNackOptions { requeue: true, ..Default::default() }).await?;
                    return Err(e.into());
                }
            }
        }
        delivery.ack(BasicAckOptions::default()).await?;
    }
}
