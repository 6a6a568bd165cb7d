//! Accepting a batch of jobs (`POST /v1/tool-calls/batch`) the way `submit` accepts one: one
//! `Idempotency-Key` for the whole batch, every job recorded, all published back to back on the
//! confirm channel and all their confirms awaited, then one answer with each job's result.
//!
//! A broker failure part-way is answered per job (207): a confirmed job is accepted, a job whose
//! publish certainly did not leave is not (its record is removed), one whose confirm never came
//! may run (`outcome_unknown`). A retry with the same key then publishes only the jobs not
//! confirmed, under the same execution ids.

use std::collections::HashSet;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tracing::Instrument;
use utoipa::ToSchema;

use fleet_platform::broker::BrokerError;
use fleet_protocol::envelope::Envelope;
use fleet_protocol::execution::ExecutionStatus;

use crate::error::ApiError;
use crate::routes::submit::{
    admit, failure_outcome, light_lane, publish_in, reserve, EnqueueFailure, FailureOutcome, Held, Recording, Reserved,
    Submission,
};
use crate::wire::Data;
use crate::AppState;

/// How many record writes (and status reads) of one batch are in flight at once.
const REDIS_CONCURRENCY: usize = 64;

/// Accepts `items` as one batch: answers 202 once the broker confirmed every job, 207 with each
/// job's result if it confirmed only some, or refuses the whole batch as `submit` refuses one job
/// when nothing was published.
pub(crate) async fn submit_batch<S: Submission>(
    state: &AppState,
    idempotency_key: Option<String>,
    span: tracing::Span,
    items: Vec<S>,
) -> Result<Response, ApiError> {
    // A batch is one submission, counted as its first call's tenant's (a tenant-bound token's
    // calls are all its tenant's).
    let _admitted = match items.first() {
        Some(first) => admit(state, first).await,
        None => None,
    };
    let (batch_id, hold) = match &idempotency_key {
        None => (fleet_protocol::new_execution_id(), None),
        Some(key) => match reserve(state, key, &batch_digest(&items), items.len()).await? {
            Reserved::Replay(batch_id) => return Ok(replayed(state, &batch_id, items.len()).await),
            Reserved::Held(hold) => (hold.execution_id().to_string(), Some(hold)),
        },
    };
    let republish = hold.as_ref().is_some_and(|h| h.republish);
    let ids: Vec<String> = (0..items.len()).map(|i| fleet_protocol::batch_item_id(&batch_id, i)).collect();
    // A retry after a partial failure skips what the broker already confirmed.
    let confirmed_before = match &hold {
        Some(hold) if republish => state.store.executions().batch_confirmed(&hold.hold).await.unwrap_or_default(),
        _ => HashSet::new(),
    };
    let batch = BatchSubmission { items: &items, ids: &ids, republish, hold: hold.as_ref() };
    match batch.enqueue(state, &confirmed_before).instrument(span).await {
        Enqueued::NotPublished { failure, recorded } => Err(batch.refuse(state, failure, &recorded).await),
        Enqueued::Published(results) => Ok(batch.answer(state, results, &confirmed_before).await),
    }
}

/// What became of a batch's publish.
enum Enqueued {
    /// Nothing was published; `recorded[i]` says whether job `i`'s record was written.
    NotPublished { failure: EnqueueFailure, recorded: Vec<bool> },
    /// Each job's result, in order (`Ok` too for one an earlier request had confirmed).
    Published(Vec<Result<(), EnqueueFailure>>),
}

struct BatchSubmission<'a, S> {
    items: &'a [S],
    ids: &'a [String],
    republish: bool,
    hold: Option<&'a Held>,
}

impl<S: Submission> BatchSubmission<'_, S> {
    fn recording(&self) -> Recording {
        Recording::of(self.hold.map(|h| h.republish))
    }

    /// Records every job not yet confirmed, then publishes them together. No record is written
    /// while the broker is certainly out of reach, and nothing is published unless every record was.
    async fn enqueue(&self, state: &AppState, confirmed_before: &HashSet<usize>) -> Enqueued {
        let n = self.items.len();
        if let Err(e) = state.broker.publisher() {
            return Enqueued::NotPublished { failure: EnqueueFailure::Publish(e), recorded: vec![false; n] };
        }
        let pending: Vec<usize> = (0..n).filter(|i| !confirmed_before.contains(i)).collect();
        let writes = pending.iter().copied().map(|i| self.items[i].record(state, &self.ids[i], self.recording()));
        let records: Vec<Result<Envelope, ApiError>> =
            futures::stream::iter(writes).buffered(REDIS_CONCURRENCY).collect().await;
        let mut recorded = vec![false; n];
        let mut envelopes = Vec::with_capacity(pending.len());
        let mut first_error = None;
        for (&i, record) in pending.iter().zip(records) {
            match record {
                Ok(envelope) => {
                    recorded[i] = true;
                    envelopes.push(envelope);
                }
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        if let Some(e) = first_error {
            return Enqueued::NotPublished { failure: EnqueueFailure::BeforePublish(e), recorded };
        }
        let mut results: Vec<Result<(), EnqueueFailure>> = (0..n).map(|_| Ok(())).collect();
        let light: Vec<bool> = pending.iter().map(|&i| light_lane(state, &self.items[i])).collect();
        for (&i, result) in pending.iter().zip(publish_in(state, &envelopes, &light).await) {
            results[i] = result;
        }
        Enqueued::Published(results)
    }

    /// Nothing was published: the batch is refused as one job would be. A first attempt's records
    /// and key are undone; a republish keeps them (an earlier attempt may have reached the queue).
    async fn refuse(&self, state: &AppState, failure: EnqueueFailure, recorded: &[bool]) -> ApiError {
        let publish = match &failure {
            EnqueueFailure::BeforePublish(_) => None,
            EnqueueFailure::Publish(e) => Some(e.publish_failure()),
        };
        match failure_outcome(publish, self.republish) {
            FailureOutcome::NotAccepted => {
                self.release_and_undo(state, recorded).await;
                match failure {
                    EnqueueFailure::BeforePublish(e) => e,
                    EnqueueFailure::Publish(e) => e.into(),
                }
            }
            FailureOutcome::Unknown => {
                if let Some(hold) = self.hold {
                    let _ = state.store.executions().abandon_request(&hold.hold).await;
                }
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "outcome_unknown",
                    "an earlier attempt of this batch may have reached the broker, and this one could not \
                     publish it: retry with the same Idempotency-Key",
                )
            }
        }
    }

    /// Frees the key (unless a retry took it over meanwhile: then the records are the retry's) and
    /// removes what this request recorded.
    async fn release_and_undo(&self, state: &AppState, recorded: &[bool]) {
        let ours = match self.hold {
            Some(hold) => state.store.executions().release_request(&hold.hold).await.unwrap_or(false),
            None => true,
        };
        if ours {
            let undo = (0..self.items.len()).map(|i| self.items[i].undo(state, &self.ids[i], recorded[i]));
            futures::stream::iter(undo).buffer_unordered(REDIS_CONCURRENCY).collect::<Vec<()>>().await;
        }
    }

    /// The answer once something was published: 202 when every job is accepted, else 207 with each
    /// job's result (or, when no job at all was accepted and none may be, the single route's 503).
    async fn answer(
        &self,
        state: &AppState,
        results: Vec<Result<(), EnqueueFailure>>,
        confirmed_before: &HashSet<usize>,
    ) -> Response {
        let outcomes: Vec<ItemOutcome> = results.into_iter().map(|r| item_outcome(r, self.republish)).collect();
        let accepted: Vec<usize> =
            (0..outcomes.len()).filter(|&i| matches!(outcomes[i], ItemOutcome::Accepted)).collect();
        let not_accepted: Vec<usize> =
            (0..outcomes.len()).filter(|&i| matches!(outcomes[i], ItemOutcome::NotAccepted(_))).collect();
        let unknown = outcomes.len() - accepted.len() - not_accepted.len();
        if accepted.len() == outcomes.len() {
            if let Some(hold) = self.hold {
                // The jobs are durable: a lost key write only means a retry republishes them (no-ops).
                if let Err(e) = state.store.executions().confirm_request(&hold.hold).await {
                    tracing::warn!(error = %e, "batch accepted, but the Idempotency-Key was not recorded");
                }
            }
        } else if accepted.is_empty() && unknown == 0 {
            self.release_and_undo(state, &vec![true; outcomes.len()]).await;
            let Some(ItemOutcome::NotAccepted(e)) = outcomes.into_iter().next() else { unreachable!("not accepted") };
            return e.into_response();
        } else {
            let undo = not_accepted.iter().copied().map(|i| self.items[i].undo(state, &self.ids[i], true));
            futures::stream::iter(undo).buffer_unordered(REDIS_CONCURRENCY).collect::<Vec<()>>().await;
            if let Some(hold) = self.hold {
                let confirmed: Vec<usize> = accepted.iter().chain(confirmed_before).copied().collect();
                if let Err(e) = state.store.executions().note_batch_confirmed(&hold.hold, &confirmed).await {
                    tracing::warn!(error = %e, "a retry of this batch will publish its confirmed jobs again (no-ops)");
                }
                let _ = state.store.executions().abandon_request(&hold.hold).await;
            }
            tracing::warn!(
                accepted = accepted.len(),
                not_accepted = not_accepted.len(),
                unknown,
                "batch accepted in part"
            );
        }
        let calls: Vec<BatchCallResult> = outcomes.iter().zip(self.ids).map(|(o, id)| o.result(id)).collect();
        let status = if accepted.len() == calls.len() { StatusCode::ACCEPTED } else { StatusCode::MULTI_STATUS };
        batch_body(status, calls, accepted.len())
    }
}

/// One job's result in a batch's answer.
enum ItemOutcome {
    Accepted,
    /// Certainly not accepted (its record is removed): the single route's 503 `broker_unavailable`.
    NotAccepted(ApiError),
    /// It may run: the single route's 503 `outcome_unknown`.
    Unknown(ApiError),
}

fn item_outcome(result: Result<(), EnqueueFailure>, republish: bool) -> ItemOutcome {
    let error = match result {
        Ok(()) => return ItemOutcome::Accepted,
        Err(EnqueueFailure::Publish(e)) => e,
        // Records are all written before anything is published.
        Err(EnqueueFailure::BeforePublish(e)) => return ItemOutcome::NotAccepted(e),
    };
    match failure_outcome(Some(error.publish_failure()), republish) {
        FailureOutcome::NotAccepted => ItemOutcome::NotAccepted(error.into()),
        FailureOutcome::Unknown => ItemOutcome::Unknown(unknown_error(&error)),
    }
}

fn unknown_error(error: &BrokerError) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "outcome_unknown",
        format!(
            "the broker did not confirm this job ({error}): it may or may not have been accepted; retry the \
             batch with the same Idempotency-Key, or look up the execution"
        ),
    )
}

impl ItemOutcome {
    fn result(&self, execution_id: &str) -> BatchCallResult {
        let execution_id = execution_id.to_string();
        match self {
            ItemOutcome::Accepted => BatchCallResult::accepted(execution_id, ExecutionStatus::Queued),
            ItemOutcome::NotAccepted(e) | ItemOutcome::Unknown(e) => BatchCallResult {
                execution_id,
                status: None,
                error: Some(BatchCallError { code: e.code, message: e.message.clone() }),
            },
        }
    }
}

/// A batch's answer (`data`): how many calls were accepted, and each call's result.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BatchResult {
    /// How many calls the broker confirmed.
    accepted: usize,
    /// How many it did not (0 with a 202).
    failed: usize,
    /// One result per call, in request order.
    calls: Vec<BatchCallResult>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BatchCallResult {
    /// `exec_<batch>_<index>`: the same again when the batch is retried with its `Idempotency-Key`.
    execution_id: String,
    /// An accepted call's status (`queued`; a replay reports the current one). Absent on error.
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<ExecutionStatus>,
    /// A call not accepted: `broker_unavailable` (it was not accepted) or `outcome_unknown` (it
    /// may run); retry the batch with the same `Idempotency-Key`.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<BatchCallError>,
}

impl BatchCallResult {
    fn accepted(execution_id: String, status: ExecutionStatus) -> Self {
        Self { execution_id, status: Some(status), error: None }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BatchCallError {
    code: &'static str,
    message: String,
}

fn batch_body(status: StatusCode, calls: Vec<BatchCallResult>, accepted: usize) -> Response {
    let failed = calls.len() - accepted;
    (status, Data::json(BatchResult { accepted, failed, calls })).into_response()
}

/// A replayed batch's answer: its jobs' ids again, with their current statuses.
async fn replayed(state: &AppState, batch_id: &str, len: usize) -> Response {
    let lookups = (0..len).map(|i| async move {
        let id = fleet_protocol::batch_item_id(batch_id, i);
        let status = match state.store.executions().get_execution(&id).await {
            Ok(Some(view)) => view.record.status,
            _ => ExecutionStatus::Queued,
        };
        BatchCallResult::accepted(id, status)
    });
    let calls: Vec<BatchCallResult> = futures::stream::iter(lookups).buffered(REDIS_CONCURRENCY).collect().await;
    let mut response = batch_body(StatusCode::ACCEPTED, calls, len);
    response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    response
}

/// What a batch asks for: its jobs' digests in order (a key sent with one job and then with a
/// batch is refused as reused, never replayed across them).
fn batch_digest<S: Submission>(items: &[S]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"batch\n");
    for item in items {
        hasher.update(item.body_digest().as_bytes());
        hasher.update(b"\n");
    }
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_platform::broker::PublishFailure;

    #[test]
    fn a_job_whose_publish_never_left_is_not_accepted_and_an_unconfirmed_one_may_run() {
        let outcome = |e: BrokerError, republish| item_outcome(Err(EnqueueFailure::Publish(e)), republish);
        assert!(matches!(item_outcome(Ok(()), false), ItemOutcome::Accepted));
        assert!(
            matches!(outcome(BrokerError::Unavailable, false), ItemOutcome::NotAccepted(e) if e.code == "broker_unavailable")
        );
        assert!(matches!(outcome(BrokerError::Nacked, false), ItemOutcome::Unknown(e) if e.code == "outcome_unknown"));
        // A republish may follow an earlier attempt that reached the queue.
        assert!(matches!(outcome(BrokerError::Unavailable, true), ItemOutcome::Unknown(_)));
        assert_eq!(BrokerError::Unroutable.publish_failure(), PublishFailure::NotSent);
    }
}
