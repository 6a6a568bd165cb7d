//! `GET /v1/executions/{id}`: an execution's record (and a turn's summary);
//! `POST /v1/executions/{id}/cancel`: cancel it, if nothing of it is being sent.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use fleet_platform::now_ms;
use fleet_platform::store::{CancelRequest, ExecutionView};
use fleet_protocol::envelope::{Envelope, Job, TurnJob};
use fleet_protocol::execution::ExecutionStatus;
use fleet_protocol::timefmt::rfc3339_from_millis;

use crate::error::ApiError;
use crate::AppState;

fn execution_json(v: &ExecutionView) -> Value {
    json!({
        "execution_id": v.execution_id,
        "kind": v.kind,
        "status": v.status.as_str(),
        "tool_name": v.tool_name,
        "room_id": v.room_id,
        "assistant_id": v.assistant_id,
        "created_at": rfc3339_from_millis(v.created_at_ms),
        "updated_at": rfc3339_from_millis(v.updated_at_ms),
        // A scheduled call's due time (it stays `queued` until then); null for one that ran at once.
        "run_at": v.run_at_ms.map(rfc3339_from_millis),
        "attempts": v.attempts,
        "result": v.result,
        "last_error": v.last_error,
    })
}

#[utoipa::path(get, path = "/v1/executions/{id}", tag = "executions", security(("bearer" = ["executions:read"])),
    params(("id" = String, Path, description = "The execution id a 202 returned")),
    responses((status = 200, description = "The execution", body = crate::routes::docs::ExecutionResponse),
        (status = 404, description = "No such execution", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn get_execution(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if !fleet_protocol::envelope::is_valid_execution_id(&id) {
        return Err(ApiError::not_found(format!("no execution {id:?}")));
    }
    let view =
        state.store.get_execution(&id).await?.ok_or_else(|| ApiError::not_found(format!("no execution {id:?}")))?;
    let mut data = execution_json(&view);
    if view.kind == "turn" {
        if let Some(turn) = crate::routes::turns::turn_summary(&state, &id).await? {
            data["turn"] = turn;
        }
    }
    Ok(Json(json!({"data": data})))
}

/// Cancels an execution. A tool call (or webhook delivery) still `queued`, or `retrying` between
/// attempts, becomes `cancelled` at once and is never sent (again); one whose attempt is being sent
/// cannot be unsent: 409 `already_sent`. A turn is marked and stops before its next model call
/// (its session's stream gets `error` `cancelled`, then `done`; its status becomes `cancelled`);
/// a model call already under way is not cut short. An execution that already ended: 409
/// `already_finished`.
#[utoipa::path(post, path = "/v1/executions/{id}/cancel", tag = "executions", security(("bearer" = ["executions:write"])),
    params(("id" = String, Path, description = "The execution id a 202 returned")),
    responses((status = 202, description = "Cancelled (a tool call: `status` is `cancelled`) or, for a turn, requested (`status` is still its current one)", body = crate::routes::docs::CancelResponse),
        (status = 404, description = "No such execution", body = crate::routes::docs::ErrorBody),
        (status = 409, description = "Nothing to cancel: `already_sent` (a tool call's attempt is being sent and cannot be unsent) or `already_finished`", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn cancel_execution(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if !fleet_protocol::envelope::is_valid_execution_id(&id) {
        return Err(ApiError::not_found(format!("no execution {id:?}")));
    }
    let answer = match state.store.request_cancel(&id, now_ms()).await? {
        CancelRequest::Missing => return Err(ApiError::not_found(format!("no execution {id:?}"))),
        CancelRequest::Finished(status) => {
            let message = format!("execution {id} already ended ({}); there is nothing to cancel", status.as_str());
            return Err(ApiError::new(StatusCode::CONFLICT, "already_finished", message));
        }
        CancelRequest::AlreadySent(_) => {
            let message = format!(
                "execution {id}'s attempt has already been sent to its receiver and cannot be unsent; \
                 its outcome will be recorded as usual"
            );
            return Err(ApiError::new(StatusCode::CONFLICT, "already_sent", message));
        }
        CancelRequest::Cancelled { before } => {
            let mut data = json!({"execution_id": id, "status": ExecutionStatus::Cancelled.as_str()});
            if before == ExecutionStatus::Retrying {
                data["note"] =
                    json!("an earlier attempt was already sent and cannot be unsent; no further attempt runs");
            }
            data
        }
        CancelRequest::Requested(status) => {
            nudge_turn(&state, &id).await;
            json!({"execution_id": id, "status": status.as_str(),
                "note": "the turn stops before its next model call (a model call under way is not cut short); its status becomes cancelled then"})
        }
    };
    // A cancelled job no longer waits to start: it leaves the oldest-waiting-job age.
    let kind = state.store.get_execution(&id).await.ok().flatten().map(|v| v.kind).unwrap_or_default();
    let _ = state.store.mark_started(&id, &kind).await;
    Ok((StatusCode::ACCEPTED, Json(json!({"data": answer}))).into_response())
}

/// Publishes a step of the turn at its current round, so a turn with no step in flight (waiting
/// for a slow tool) sees the cancel now rather than when its tools answer. Step ids derive from
/// turn and round, so a copy of a step that runs or ran anyway does nothing twice. Best effort:
/// without it the turn stops at its next step all the same.
async fn nudge_turn(state: &AppState, id: &str) {
    let turn = match state.store.load_turn(id).await {
        Ok(Some(turn)) => turn,
        _ => return,
    };
    let step = Job::Turn(TurnJob { session_id: turn.session_id.clone(), round: turn.round });
    if crate::routes::submit::publish(state, &Envelope::new(id.to_string(), step, now_ms())).await.is_err() {
        tracing::warn!(execution_id = %id, "cannot publish the cancelled turn's step; it stops at its next step");
    }
}
