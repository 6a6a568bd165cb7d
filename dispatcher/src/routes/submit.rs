//! Accepting a job a client submits (`POST /v1/tool-calls`, `POST /v1/turns`, and a batch of them,
//! `POST /v1/tool-calls/batch`): its `Idempotency-Key` reserved or answered from, the job recorded
//! and published with a publisher confirm, and a failure refused by what it means.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tracing::Instrument;
use utoipa::ToSchema;

use fleet_platform::broker::{BrokerError, Outgoing, PublishFailure};
use fleet_platform::store::{RequestHold, Reservation};
use fleet_platform::telemetry;
use fleet_protocol::envelope::{Envelope, JobKind};
use fleet_protocol::execution::ExecutionStatus;
use fleet_protocol::fair::Priority;
use fleet_protocol::schedule::first_destination;
use fleet_protocol::topology::light_key;

use crate::error::ApiError;
use crate::lanes::Admitted;
use crate::wire::Data;
use crate::AppState;

/// One kind of job a client submits (`POST /v1/tool-calls`, `POST /v1/turns`): what its
/// `Idempotency-Key` compares, how it is recorded and published, and what a refused one leaves.
/// Everything else about accepting a job is `submit`'s, the same for every kind.
pub(crate) trait Submission {
    /// A digest of what the request asks for (not of its bytes: key order and spacing do not count).
    fn body_digest(&self) -> String;
    /// The server span the enqueue runs in.
    fn span(&self, execution_id: &str) -> tracing::Span;
    /// Records the job (a republish keeps what an earlier attempt recorded) and returns the
    /// envelope to publish.
    async fn record(&self, state: &AppState, execution_id: &str, recording: Recording) -> Result<Envelope, ApiError>;
    /// Removes what a first attempt wrote, once it is certain nothing was accepted; `recorded` says
    /// whether `record` succeeded (when it failed, part of it may still have been written).
    async fn undo(&self, state: &AppState, execution_id: &str, recorded: bool);
    /// The job's kind, tenant and priority, when it is a new job that may take its kind's light
    /// lane (and whose tenant's submissions are counted by `LightLanes`).
    fn lane(&self) -> Option<(JobKind, &str, Priority)> {
        None
    }
}

/// Whether a job's execution may be recorded again by another request: only one with the same
/// `Idempotency-Key`, which republishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recording {
    /// No key: no other request records this execution.
    Once,
    /// The key's first request: a retry with the key may republish the execution.
    First,
    /// A retry with the key, taking over an earlier attempt that may have recorded and published.
    Republish,
}

impl Recording {
    /// From the request's hold on its key, if it has one: `Some(republish)`.
    pub(crate) fn of(held: Option<bool>) -> Self {
        match held {
            None => Recording::Once,
            Some(false) => Recording::First,
            Some(true) => Recording::Republish,
        }
    }

    pub(crate) fn republish(self) -> bool {
        self == Recording::Republish
    }
}

/// Whether the job takes its kind's light lane (a new job of a tenant not flooding the fleet).
pub(crate) fn light_lane<S: Submission>(state: &AppState, submission: &S) -> bool {
    submission.lane().is_some_and(|(kind, tenant, priority)| state.lanes.take(kind, tenant, priority))
}

/// Waits for the submission's place among its tenant's being taken in (`LightLanes::admit`).
pub(crate) async fn admit<S: Submission>(state: &AppState, submission: &S) -> Option<Admitted> {
    let (kind, tenant, _) = submission.lane()?;
    let admitted = state.lanes.admit(kind, tenant).await;
    if admitted.waited() {
        state.metrics.submissions_held.with_label_values(&[kind.as_str()]).inc();
    }
    Some(admitted)
}

/// Records the job and publishes it with a confirm. No record is written while the broker is
/// certainly out of reach.
async fn enqueue<S: Submission>(
    state: &AppState,
    submission: &S,
    execution_id: &str,
    recording: Recording,
) -> Result<(), EnqueueFailure> {
    state.broker.publisher().map_err(EnqueueFailure::Publish)?;
    let envelope = submission.record(state, execution_id, recording).await.map_err(EnqueueFailure::BeforePublish)?;
    let light = light_lane(state, submission);
    publish_in(state, std::slice::from_ref(&envelope), &[light]).await.pop().expect("one result per envelope")
}

/// Accepts a job: reserves its `Idempotency-Key` (or answers from it), enqueues it, and answers 202
/// once the broker confirmed it, or refuses it by what the failure means.
pub(crate) async fn submit<S: Submission>(
    state: &AppState,
    idempotency_key: Option<String>,
    headers: &HeaderMap,
    submission: S,
) -> Result<Response, ApiError> {
    let job = submit_job(state, idempotency_key, headers, submission).await?;
    Ok(accepted(state, &job).await)
}

/// A job the broker confirmed (now, or for an earlier request with the same `Idempotency-Key`).
pub(crate) struct Accepted {
    pub(crate) execution_id: String,
    /// The answer replays an earlier request's (its key was used before, or this request took
    /// over an earlier attempt that may have published).
    pub(crate) replayed: bool,
}

/// `submit` for a route that answers in its own way (a room's message answers the stored message).
pub(crate) async fn submit_job<S: Submission>(
    state: &AppState,
    idempotency_key: Option<String>,
    headers: &HeaderMap,
    submission: S,
) -> Result<Accepted, ApiError> {
    let _admitted = admit(state, &submission).await;
    let (execution_id, hold) = match &idempotency_key {
        None => (fleet_protocol::new_execution_id(), None),
        Some(key) => match reserve(state, key, &submission.body_digest(), 1).await? {
            Reserved::Replay(previous) => return Ok(Accepted { execution_id: previous, replayed: true }),
            Reserved::Held(hold) => (hold.execution_id().to_string(), Some(hold)),
        },
    };
    let recording = Recording::of(hold.as_ref().map(|h| h.republish));
    let republish = recording.republish();
    let span = submission.span(&execution_id);
    telemetry::set_parent(&span, telemetry::from_http_headers(headers));
    let result = enqueue(state, &submission, &execution_id, recording).instrument(span).await;
    match result {
        Ok(()) => {
            if let Some(hold) = &hold {
                // The job is durable: a lost key write only means that a retry with this key
                // publishes the same execution again once the reservation expires (a no-op).
                if let Err(e) = state.store.executions().confirm_request(&hold.hold).await {
                    tracing::warn!(error = %e, execution_id, "accepted, but the Idempotency-Key was not recorded");
                }
            }
            Ok(Accepted { execution_id, replayed: republish })
        }
        Err(failure) => Err(refuse(state, &submission, &execution_id, hold.as_ref(), republish, failure).await),
    }
}

/// A request's hold on its `Idempotency-Key`, and whether it takes over an earlier attempt.
pub(crate) struct Held {
    pub(crate) hold: RequestHold,
    pub(crate) republish: bool,
}

impl std::ops::Deref for Held {
    type Target = RequestHold;
    fn deref(&self) -> &RequestHold {
        &self.hold
    }
}

pub(crate) enum Reserved {
    /// The key's request was accepted as this execution (a batch's: the id its items' derive from).
    Replay(String),
    Held(Held),
}

/// Reserves the key for a request of `jobs` jobs, or says what the key already holds.
pub(crate) async fn reserve(state: &AppState, key: &str, body_digest: &str, jobs: usize) -> Result<Reserved, ApiError> {
    let common = &state.config.common;
    // A big batch writes its records before it publishes: its reservation allows for both.
    let writes = if jobs > 1 { 2 } else { 1 };
    let pending_for = common.publish_timeout + common.redis_timeout * writes;
    let fresh = fleet_protocol::new_execution_id();
    Ok(match state.store.executions().reserve_request(key, &fresh, body_digest, pending_for).await? {
        Reservation::New(hold) => Reserved::Held(Held { hold, republish: false }),
        Reservation::Unconfirmed(hold) => Reserved::Held(Held { hold, republish: true }),
        Reservation::Existing(previous) => Reserved::Replay(previous),
        Reservation::InProgress => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "request_in_progress",
                "a request with this Idempotency-Key is still being accepted; retry shortly",
            ))
        }
        Reservation::Reused => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "this Idempotency-Key was already used with a different request body; use a new key",
            ))
        }
    })
}

/// Why an enqueue failed: before anything was published, or in the publish.
pub(crate) enum EnqueueFailure {
    BeforePublish(ApiError),
    Publish(BrokerError),
}

/// What a failed enqueue means for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureOutcome {
    /// Nothing was accepted: the record goes, the key is freed.
    NotAccepted,
    /// The job may run: the record and the key's mapping stay.
    Unknown,
}

/// `publish` is `None` when the failure came before the publish. A republish is never "not
/// accepted": an earlier attempt of the same execution may have reached the queue.
pub(crate) fn failure_outcome(publish: Option<PublishFailure>, republish: bool) -> FailureOutcome {
    match (publish, republish) {
        (_, true) | (Some(PublishFailure::Unknown), false) => FailureOutcome::Unknown,
        (None | Some(PublishFailure::NotSent), false) => FailureOutcome::NotAccepted,
    }
}

/// Undoes or keeps what the request wrote, by what the failure means, and builds its answer.
async fn refuse<S: Submission>(
    state: &AppState,
    submission: &S,
    execution_id: &str,
    hold: Option<&Held>,
    republish: bool,
    failure: EnqueueFailure,
) -> ApiError {
    let publish = match &failure {
        EnqueueFailure::BeforePublish(_) => None,
        EnqueueFailure::Publish(e) => Some(e.publish_failure()),
    };
    match failure_outcome(publish, republish) {
        FailureOutcome::NotAccepted => {
            // A request that outlived its reservation may find the key taken over by a retry that
            // republishes this execution: then the record is the retry's, and stays.
            let ours = match hold {
                Some(hold) => state.store.executions().release_request(&hold.hold).await.unwrap_or(false),
                None => true,
            };
            if ours {
                let recorded = matches!(failure, EnqueueFailure::Publish(_));
                submission.undo(state, execution_id, recorded).await;
            }
            match failure {
                EnqueueFailure::BeforePublish(e) => e,
                EnqueueFailure::Publish(e) => e.into(),
            }
        }
        FailureOutcome::Unknown => {
            if let Some(hold) = hold {
                let _ = state.store.executions().abandon_request(&hold.hold).await;
            }
            let why = match failure {
                EnqueueFailure::BeforePublish(e) => e.message,
                EnqueueFailure::Publish(e) => e.to_string(),
            };
            tracing::warn!(execution_id, error = %why, "publish outcome unknown");
            ApiError::outcome_unknown(execution_id, &why)
        }
    }
}

/// Publishes a new job under a producer span and waits for the broker's confirm.
pub(crate) async fn publish(state: &AppState, envelope: &Envelope) -> Result<(), EnqueueFailure> {
    publish_all(state, std::slice::from_ref(envelope)).await.pop().expect("one result per envelope")
}

/// Publishes new jobs, each under its producer span, back to back on the confirm channel, and
/// waits for all their confirms; each job's result, in order. A job not yet due (a scheduled call)
/// goes to the delay queue that holds it (`schedule::first_destination`), any other to its kind's
/// work queue.
pub(crate) async fn publish_all(state: &AppState, envelopes: &[Envelope]) -> Vec<Result<(), EnqueueFailure>> {
    publish_in(state, envelopes, &[]).await
}

/// `publish_all`, with each job due now whose `light` is true sent to its kind's light lane
/// (`Topology::light_queue`); jobs past the end of `light` go to the work queue.
pub(crate) async fn publish_in(
    state: &AppState,
    envelopes: &[Envelope],
    light: &[bool],
) -> Vec<Result<(), EnqueueFailure>> {
    let publisher = match state.broker.publisher() {
        Ok(publisher) => publisher,
        Err(_) => return envelopes.iter().map(|_| Err(EnqueueFailure::Publish(BrokerError::Unavailable))).collect(),
    };
    let common = &state.config.common;
    let now = fleet_platform::now_ms();
    let mut spans = Vec::with_capacity(envelopes.len());
    let messages: Vec<Outgoing> = envelopes
        .iter()
        .enumerate()
        .map(|(i, envelope)| {
            let (exchange, mut routing_key) = first_destination(&common.topology, &common.retry, envelope, now);
            // Only a job due now goes to a lane (a scheduled one waits in a delay queue first).
            let light_now = light.get(i) == Some(&true) && exchange == common.topology.jobs_exchange();
            if let Some(lane) = light_now.then(|| light_key(envelope.kind())).flatten() {
                routing_key = lane;
            }
            let span = send_span(envelope, &exchange, &routing_key);
            let headers = telemetry::amqp_headers(&span);
            spans.push(span);
            Outgoing::job(exchange, routing_key, envelope, headers)
        })
        .collect();
    let results = publisher.publish_many(&messages).await;
    drop(spans);
    envelopes
        .iter()
        .zip(results)
        .map(|(envelope, result)| {
            result.map_err(EnqueueFailure::Publish)?;
            state.metrics.jobs_published.with_label_values(&[envelope.kind().as_str()]).inc();
            let execution_id = envelope.execution_id.as_str();
            tracing::info!(execution_id, trace_id = %telemetry::trace_id(&tracing::Span::current()), "job accepted");
            Ok(())
        })
        .collect()
}

/// The producer span of one job's publish.
fn send_span(envelope: &Envelope, exchange: &str, routing_key: &str) -> tracing::Span {
    let destination = if exchange.is_empty() { routing_key.to_string() } else { format!("{exchange}:{routing_key}") };
    tracing::info_span!(
        "send",
        otel.name = format!("send {}", if exchange.is_empty() { routing_key } else { exchange }),
        otel.kind = "producer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "send",
        messaging.destination.name = destination,
        messaging.rabbitmq.destination.routing_key = routing_key,
        messaging.message.id = envelope.execution_id.as_str(),
    )
}

/// A job accepted: the broker confirmed it (the answer's `data`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AcceptedJob {
    pub execution_id: String,
    /// `queued` for a fresh job; a replayed `Idempotency-Key` reports the execution's current status.
    pub status: ExecutionStatus,
    /// Said when the answer is not the plain acceptance (a dead letter whose execution had ended).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<&'static str>,
}

impl AcceptedJob {
    pub(crate) fn new(execution_id: String, status: ExecutionStatus) -> Self {
        Self { execution_id, status, note: None }
    }
}

/// The 202 body. A fresh job is `queued` (it may already be running: that is not this answer's
/// news); a replayed `Idempotency-Key` reports the execution's current status.
async fn accepted(state: &AppState, job: &Accepted) -> Response {
    let (execution_id, replayed) = (job.execution_id.as_str(), job.replayed);
    let status = match replayed {
        false => ExecutionStatus::Queued,
        true => match state.store.executions().get_execution(execution_id).await {
            Ok(Some(view)) => view.record.status,
            _ => ExecutionStatus::Queued,
        },
    };
    let mut response =
        (StatusCode::ACCEPTED, Data::json(AcceptedJob::new(execution_id.to_string(), status))).into_response();
    if replayed {
        mark_replayed(&mut response);
    }
    response
}

/// Says that the answer replays an earlier request's (`idempotent-replayed: true`).
pub(crate) fn mark_replayed(response: &mut Response) {
    response.headers_mut().insert("idempotent-replayed", axum::http::HeaderValue::from_static("true"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_request_with_a_key_may_be_recorded_again() {
        assert_eq!(Recording::of(None), Recording::Once);
        assert_eq!(Recording::of(Some(false)), Recording::First);
        assert_eq!(Recording::of(Some(true)), Recording::Republish);
        assert!(Recording::of(Some(true)).republish());
        assert!(!Recording::of(Some(false)).republish() && !Recording::of(None).republish());
    }

    #[test]
    fn only_a_first_publish_that_certainly_did_not_leave_is_not_accepted() {
        use FailureOutcome::*;
        assert_eq!(failure_outcome(None, false), NotAccepted);
        assert_eq!(failure_outcome(Some(PublishFailure::NotSent), false), NotAccepted);
        assert_eq!(failure_outcome(Some(PublishFailure::Unknown), false), Unknown);
        for publish in [None, Some(PublishFailure::NotSent), Some(PublishFailure::Unknown)] {
            assert_eq!(failure_outcome(publish, true), Unknown, "{publish:?}");
        }
    }
}
