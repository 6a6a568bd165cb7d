//! Accepting a job a client submits (`POST /v1/tool-calls`, `POST /v1/turns`): its
//! `Idempotency-Key` reserved or answered from, the job recorded and published with a publisher
//! confirm, and a failure refused by what it means.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use sha2::{Digest, Sha256};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use fleet_platform::broker::{BrokerError, PublishFailure};
use fleet_platform::store::{RequestHold, Reservation};
use fleet_platform::telemetry;
use fleet_protocol::envelope::Envelope;
use fleet_protocol::execution::ExecutionStatus;

use crate::error::ApiError;
use crate::routes::common::Caller;
use crate::{validate, AppState};

/// The request's `Idempotency-Key` as its store key (namespaced by the caller), if it sent one.
pub(crate) fn request_key(state: &AppState, caller: &Caller, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else { return Ok(None) };
    let k = v.to_str().map_err(|_| ApiError::malformed("Idempotency-Key must be visible ASCII"))?;
    validate::idempotency_key(k)?;
    Ok(Some(state.store.keys().request_key(&caller.0, &hex::encode(Sha256::digest(k.as_bytes())))))
}

/// One kind of job a client submits (`POST /v1/tool-calls`, `POST /v1/turns`): what its
/// `Idempotency-Key` compares, how it is recorded and published, and what a refused one leaves.
/// Everything else about accepting a job is `submit`'s, the same for every kind.
pub(crate) trait Submission {
    /// A digest of what the request asks for (not of its bytes: key order and spacing do not count).
    fn body_digest(&self) -> String;
    /// The server span the enqueue runs in.
    fn span(&self, execution_id: &str) -> tracing::Span;
    /// Records the job (a republish keeps what an earlier attempt recorded), then publishes it and
    /// waits for the broker's confirm.
    async fn enqueue(&self, state: &AppState, execution_id: &str, republish: bool) -> Result<(), EnqueueFailure>;
    /// Removes what a first attempt wrote, once it is certain nothing was accepted.
    async fn undo(&self, state: &AppState, execution_id: &str, failure: &EnqueueFailure);
}

/// Accepts a job: reserves its `Idempotency-Key` (or answers from it), enqueues it, and answers 202
/// once the broker confirmed it, or refuses it by what the failure means.
pub(crate) async fn submit<S: Submission>(
    state: &AppState,
    idempotency_key: Option<String>,
    headers: &HeaderMap,
    submission: S,
) -> Result<Response, ApiError> {
    let (execution_id, hold) = match &idempotency_key {
        None => (fleet_protocol::new_execution_id(), None),
        Some(key) => match reserve(state, key, &submission.body_digest()).await? {
            Reserved::Answer(response) => return Ok(response),
            Reserved::Held(hold) => (hold.execution_id().to_string(), Some(hold)),
        },
    };
    let republish = hold.as_ref().is_some_and(|h| h.republish);
    let span = submission.span(&execution_id);
    let _ = span.set_parent(telemetry::from_http_headers(headers));
    let result = submission.enqueue(state, &execution_id, republish).instrument(span).await;
    match result {
        Ok(()) => {
            if let Some(hold) = &hold {
                // The job is durable: a lost key write only means that a retry with this key
                // publishes the same execution again once the reservation expires (a no-op).
                if let Err(e) = state.store.confirm_request(&hold.hold).await {
                    tracing::warn!(error = %e, execution_id, "accepted, but the Idempotency-Key was not recorded");
                }
            }
            Ok(accepted(state, &execution_id, republish).await)
        }
        Err(failure) => Err(refuse(state, &submission, &execution_id, hold.as_ref(), republish, failure).await),
    }
}

/// A request's hold on its `Idempotency-Key`, and whether it takes over an earlier attempt.
struct Held {
    hold: RequestHold,
    republish: bool,
}

impl std::ops::Deref for Held {
    type Target = RequestHold;
    fn deref(&self) -> &RequestHold {
        &self.hold
    }
}

enum Reserved {
    Answer(Response),
    Held(Held),
}

/// Reserves the key for this request, or answers from what the key already holds.
async fn reserve(state: &AppState, key: &str, body_digest: &str) -> Result<Reserved, ApiError> {
    let pending_for = state.config.common.publish_timeout + state.config.common.redis_timeout;
    let fresh = fleet_protocol::new_execution_id();
    Ok(match state.store.reserve_request(key, &fresh, body_digest, pending_for).await? {
        Reservation::New(hold) => Reserved::Held(Held { hold, republish: false }),
        Reservation::Unconfirmed(hold) => Reserved::Held(Held { hold, republish: true }),
        Reservation::Existing(previous) => Reserved::Answer(accepted(state, &previous, true).await),
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
enum FailureOutcome {
    /// Nothing was accepted: the record goes, the key is freed.
    NotAccepted,
    /// The job may run: the record and the key's mapping stay.
    Unknown,
}

/// `publish` is `None` when the failure came before the publish. A republish is never "not
/// accepted": an earlier attempt of the same execution may have reached the queue.
fn failure_outcome(publish: Option<PublishFailure>, republish: bool) -> FailureOutcome {
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
                Some(hold) => state.store.release_request(&hold.hold).await.unwrap_or(false),
                None => true,
            };
            if ours {
                submission.undo(state, execution_id, &failure).await;
            }
            match failure {
                EnqueueFailure::BeforePublish(e) => e,
                EnqueueFailure::Publish(e) => e.into(),
            }
        }
        FailureOutcome::Unknown => {
            if let Some(hold) = hold {
                let _ = state.store.abandon_request(&hold.hold).await;
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
    let publisher = state.broker.publisher().map_err(EnqueueFailure::Publish)?;
    let execution_id = envelope.execution_id.as_str();
    let topology = &state.config.common.topology;
    let exchange = topology.jobs_exchange();
    let routing_key = envelope.kind().as_str();
    let send = tracing::info_span!(
        "send",
        otel.name = format!("send {exchange}"),
        otel.kind = "producer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "send",
        messaging.destination.name = format!("{exchange}:{routing_key}"),
        messaging.rabbitmq.destination.routing_key = routing_key,
        messaging.message.id = execution_id,
    );
    let headers = telemetry::amqp_headers(&send);
    publisher.publish_job(topology, envelope, headers).instrument(send).await.map_err(EnqueueFailure::Publish)?;
    state.metrics.jobs_published.with_label_values(&[envelope.kind().as_str()]).inc();
    tracing::info!(execution_id, trace_id = %telemetry::trace_id(&tracing::Span::current()), "job accepted");
    Ok(())
}

/// The 202 body. A fresh job is `queued` (it may already be running: that is not this answer's
/// news); a replayed `Idempotency-Key` reports the execution's current status.
async fn accepted(state: &AppState, execution_id: &str, replayed: bool) -> Response {
    let status = match replayed {
        false => ExecutionStatus::Queued,
        true => match state.store.get_execution(execution_id).await {
            Ok(Some(view)) => view.status,
            _ => ExecutionStatus::Queued,
        },
    };
    let mut response =
        (StatusCode::ACCEPTED, Json(json!({"data": {"execution_id": execution_id, "status": status.as_str()}})))
            .into_response();
    if replayed {
        response.headers_mut().insert("idempotent-replayed", axum::http::HeaderValue::from_static("true"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

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
