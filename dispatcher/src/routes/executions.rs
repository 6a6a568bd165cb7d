//! `GET /v1/executions`: executions newest first, filtered (the executions index);
//! `GET /v1/executions/{id}`: an execution's record (and a turn's summary);
//! `POST /v1/executions/{id}/cancel`: cancel it, if nothing of it is being sent.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use fleet_platform::now_ms;
use fleet_platform::store::{CancelRequest, ExecutionFilter, ExecutionView};
use fleet_protocol::dead_letters::ListCursor;
use fleet_protocol::envelope::JobKind;
use fleet_protocol::envelope::{Envelope, Job, TurnJob};
use fleet_protocol::execution::ExecutionRecord;
use fleet_protocol::execution::{AttemptRecord, ExecutionStatus};
use fleet_protocol::timefmt::rfc3339_from_millis;

use crate::error::ApiError;
use crate::routes::common::{page_limit, ApiQuery, Tenancy};
use crate::wire::{Data, Listed};
use crate::AppState;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ExecutionQuery {
    cursor: Option<String>,
    /// 1-200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<usize>,
    #[param(value_type = Option<fleet_protocol::execution::ExecutionStatus>)]
    status: Option<String>,
    #[param(value_type = Option<JobKind>)]
    kind: Option<String>,
    tool_name: Option<String>,
    /// A room's (session's) turns and their tool calls.
    room_id: Option<String>,
    /// The same as `room_id`: a room is a session.
    session_id: Option<String>,
    /// An operator's token: only this tenant's executions, and its session of `room_id`.
    tenant: Option<String>,
    assistant_id: Option<String>,
    /// RFC 3339: created at or after.
    since: Option<String>,
    /// RFC 3339: created before.
    until: Option<String>,
}

/// Index entries one listing request looks at, at most.
const LIST_SCAN_BUDGET: usize = 5_000;

/// The filter a query names, or the field that is wrong.
pub(crate) fn execution_filter(q: ExecutionQuery) -> Result<(ExecutionFilter, Option<ListCursor>, usize), ApiError> {
    let limit = page_limit(q.limit)?;
    let status = match q.status.as_deref() {
        Some(s) => Some(ExecutionStatus::parse(s).ok_or_else(|| {
            ApiError::invalid(format!(
                "status must be one of queued, running, retrying, succeeded, failed, dead_lettered, cancelled; got {s:?}"
            ))
        })?),
        None => None,
    };
    let kind = match q.kind.as_deref() {
        Some(k) => Some(
            JobKind::parse(k)
                .ok_or_else(|| ApiError::invalid(format!("kind must be one of tool_call, webhook, turn; got {k:?}")))?,
        ),
        None => None,
    };
    let time = |name: &str, v: Option<String>| -> Result<Option<i64>, ApiError> {
        v.map(|t| {
            fleet_protocol::timefmt::millis_from_rfc3339(&t)
                .ok_or_else(|| ApiError::invalid(format!("{name} must be an RFC 3339 timestamp")))
        })
        .transpose()
    };
    if q.room_id.is_some() && q.session_id.is_some() && q.room_id != q.session_id {
        return Err(ApiError::invalid("room_id and session_id name the same thing; give one"));
    }
    let cursor = match q.cursor.as_deref() {
        Some(c) => {
            Some(ListCursor::parse(c).ok_or_else(|| ApiError::invalid("cursor is not a cursor this API returned"))?)
        }
        None => None,
    };
    let filter = ExecutionFilter {
        status,
        kind,
        tool_name: q.tool_name.filter(|t| !t.is_empty()),
        room_id: q.room_id.or(q.session_id).filter(|r| !r.is_empty()),
        assistant_id: q.assistant_id.filter(|a| !a.is_empty()),
        since_ms: time("since", q.since)?,
        until_ms: time("until", q.until)?,
        tenant: None,
    };
    Ok((filter, cursor, limit))
}

/// An execution as a listing shows it: its record without result or attempt history.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ExecutionSummary)]
pub(crate) struct ExecutionSummaryOut {
    execution_id: String,
    kind: JobKind,
    status: ExecutionStatus,
    tool_name: Option<String>,
    /// The room (session) a turn or its tool call belongs to.
    room_id: Option<String>,
    assistant_id: Option<String>,
    /// Whose work it is.
    tenant: Option<String>,
    created_at: String,
    updated_at: String,
    /// Attempts made so far.
    attempts: u32,
    last_error: Option<String>,
}

impl From<&ExecutionRecord> for ExecutionSummaryOut {
    fn from(e: &ExecutionRecord) -> Self {
        Self {
            execution_id: e.execution_id.clone(),
            kind: e.kind,
            status: e.status,
            tool_name: e.tool_name.clone(),
            room_id: e.room_id.as_deref().map(|r| fleet_protocol::tenant::session_key_shown(r).to_string()),
            assistant_id: e.assistant_id.clone(),
            tenant: e.tenant.clone(),
            created_at: rfc3339_from_millis(e.created_at_ms),
            updated_at: rfc3339_from_millis(e.updated_at_ms),
            attempts: e.attempts,
            last_error: e.last_error.clone(),
        }
    }
}

/// Newest first (by creation), filtered by status, kind, tool, room (session), assistant and time;
/// `next_cursor` continues the listing. It reads the executions index (kept for
/// `FLEET_EXECUTION_INDEX_RETENTION`, at most `FLEET_EXECUTION_INDEX_MAX` entries per set), and one
/// request looks at a bounded number of entries: a page may come back short (even empty) with a
/// `next_cursor` when few match, and only `next_cursor: null` means the end.
#[utoipa::path(get, path = "/v1/executions", extensions(("x-tenancy" = json!("listing"))), tag = "executions", security(("bearer" = ["executions:read"])),
    params(ExecutionQuery),
    responses((status = 200, description = "Executions, newest first", body = Listed<ExecutionSummaryOut>), crate::routes::docs::CommonErrors))]
pub(crate) async fn list_executions(
    State(state): State<AppState>,
    tenancy: Tenancy,
    ApiQuery(q): ApiQuery<ExecutionQuery>,
) -> Result<Json<Listed<ExecutionSummaryOut>>, ApiError> {
    let named = q.tenant.clone().filter(|t| !t.is_empty());
    let (mut filter, cursor, limit) = execution_filter(q)?;
    // A tenant-bound token lists only its tenant's executions, and its session keys are its own;
    // an operator's may name a tenant (and so that tenant's session of a key).
    if let Some(room) = &filter.room_id {
        filter.room_id = Some(crate::routes::common::named_session(&tenancy, room, named.as_deref())?);
    }
    filter.tenant = tenancy.bound.or(named);
    let (found, next) = state.store.console().list_executions(&filter, cursor, limit, LIST_SCAN_BUDGET).await?;
    Ok(Listed::json(found.iter().map(ExecutionSummaryOut::from).collect(), next.map(|c| c.to_string())))
}

/// An execution's record as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Execution)]
pub(crate) struct ExecutionOut {
    execution_id: String,
    kind: JobKind,
    status: ExecutionStatus,
    tool_name: Option<String>,
    room_id: Option<String>,
    assistant_id: Option<String>,
    /// Whose work it is: the token's tenant, the request's `tenant`, or the token's name. Null for
    /// an execution recorded before tenants, and for webhooks.
    tenant: Option<String>,
    created_at: String,
    updated_at: String,
    /// RFC 3339: when a scheduled call (`run_at`, `delay_seconds`) is due; it stays `queued`, with
    /// no attempt spent, until then. Null for a job that runs as soon as it can.
    run_at: Option<String>,
    /// Each attempt: attempt, started_at, duration_ms, outcome, and http_status or error.
    attempts: Vec<AttemptRecord>,
    /// The tool's answer once succeeded.
    result: Option<Value>,
    last_error: Option<String>,
    /// Seed 002's structured result of a tool call: the tool's own (`success`, `failed`, …), or
    /// `timeout`/`failed` for a dead-lettered call and `cancelled` for a cancelled one.
    #[serde(skip_serializing_if = "Option::is_none")]
    external_result: Option<fleet_protocol::external_result::ExternalResult>,
    /// A turn's model config (defaults applied), rounds, tool calls, final message and usage (turns only).
    #[schema(value_type = Option<serde_json::Map<String, Value>>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    turn: Option<crate::routes::turns::TurnSummary>,
}

impl From<ExecutionView> for ExecutionOut {
    fn from(v: ExecutionView) -> Self {
        Self {
            execution_id: v.record.execution_id,
            kind: v.record.kind,
            status: v.record.status,
            tool_name: v.record.tool_name,
            room_id: v.record.room_id.map(|r| fleet_protocol::tenant::session_key_shown(&r).to_string()),
            assistant_id: v.record.assistant_id,
            tenant: v.record.tenant,
            created_at: rfc3339_from_millis(v.record.created_at_ms),
            updated_at: rfc3339_from_millis(v.record.updated_at_ms),
            run_at: v.record.run_at_ms.map(rfc3339_from_millis),
            attempts: v.attempts,
            result: v.result,
            last_error: v.record.last_error,
            external_result: v.external_result,
            turn: None,
        }
    }
}

#[utoipa::path(get, path = "/v1/executions/{id}", extensions(("x-tenancy" = json!("resource"))), tag = "executions", security(("bearer" = ["executions:read"])),
    params(("id" = String, Path, description = "The execution id a 202 returned")),
    responses((status = 200, description = "The execution", body = Data<ExecutionOut>),
        (status = 404, description = "No such execution", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn get_execution(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path(id): Path<String>,
) -> Result<Json<Data<ExecutionOut>>, ApiError> {
    // A turn's record and state come in one read: clients poll this while a turn runs.
    let found = match fleet_protocol::envelope::is_valid_execution_id(&id) {
        true => state.store.sessions().get_execution_and_turn(&id).await?,
        false => None,
    };
    let (view, turn) = found.unzip();
    let mut data = ExecutionOut::from(only_visible(&tenancy, &id, view)?);
    data.turn = turn.flatten().map(crate::routes::turns::TurnSummary::from);
    Ok(Data::json(data))
}

/// Execution `id`'s record, if the caller may see it: a tenant-bound token sees only its tenant's
/// (another's answers 404, as an unknown id does).
async fn visible_execution(state: &AppState, tenancy: &Tenancy, id: &str) -> Result<ExecutionView, ApiError> {
    let view = match fleet_protocol::envelope::is_valid_execution_id(id) {
        true => state.store.executions().get_execution(id).await?,
        false => None,
    };
    only_visible(tenancy, id, view)
}

/// The record found for `id`, if there is one and the caller may see it; else 404.
fn only_visible(tenancy: &Tenancy, id: &str, view: Option<ExecutionView>) -> Result<ExecutionView, ApiError> {
    view.filter(|v| tenancy.sees(v.record.tenant.as_deref()))
        .ok_or_else(|| ApiError::not_found(format!("no execution {id:?}")))
}

/// Cancels an execution. A tool call (or webhook delivery) still `queued`, or `retrying` between
/// attempts, becomes `cancelled` at once and is never sent (again); one whose attempt is being sent
/// cannot be unsent: 409 `already_sent`. A turn is marked and stops before its next model call
/// (its session's stream gets `error` `cancelled`, then `done`; its status becomes `cancelled`);
/// a model call already under way is not cut short. An execution that already ended: 409
/// `already_finished`.
#[utoipa::path(post, path = "/v1/executions/{id}/cancel", extensions(("x-tenancy" = json!("resource"))), tag = "executions", security(("bearer" = ["executions:write"])),
    params(("id" = String, Path, description = "The execution id a 202 returned")),
    responses((status = 202, description = "Cancelled (a tool call: `status` is `cancelled`) or, for a turn, requested (`status` is still its current one)", body = Data<CancelAnswer>),
        (status = 404, description = "No such execution", body = crate::routes::docs::ErrorBody),
        (status = 409, description = "Nothing to cancel: `already_sent` (a tool call's attempt is being sent and cannot be unsent) or `already_finished`", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn cancel_execution(
    State(state): State<AppState>,
    caller: Option<axum::Extension<crate::routes::common::Caller>>,
    tenancy: Tenancy,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Data<CancelAnswer>>), ApiError> {
    if tenancy.bound.is_some() {
        visible_execution(&state, &tenancy, &id).await?;
    }
    let answer = cancel(&state, &id).await?;
    let detail = answer.detail();
    crate::routes::audit::record_api(&state, caller.as_deref(), "execution.cancel", &id, 1, Some(&detail)).await;
    Ok((StatusCode::ACCEPTED, Data::json(answer)))
}

/// What a cancel did (the answer's `data`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CancelAnswer {
    pub execution_id: String,
    /// `cancelled` for a tool call or webhook delivery; a turn's current status (it becomes
    /// `cancelled` when its next step sees the request).
    pub status: ExecutionStatus,
    /// What the cancel could not undo: an earlier attempt already sent, or a turn's model call
    /// under way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<&'static str>,
}

impl CancelAnswer {
    /// The answer as the audit log's detail.
    pub(crate) fn detail(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// Cancels `id` (see `cancel_execution`): what the answer's `data` says.
pub(crate) async fn cancel(state: &AppState, id: &str) -> Result<CancelAnswer, ApiError> {
    let (state, id) = (state, id.to_string());
    if !fleet_protocol::envelope::is_valid_execution_id(&id) {
        return Err(ApiError::not_found(format!("no execution {id:?}")));
    }
    let answer = match state.store.executions().request_cancel(&id, now_ms()).await? {
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
        CancelRequest::Cancelled { before } => CancelAnswer {
            execution_id: id,
            status: ExecutionStatus::Cancelled,
            note: (before == ExecutionStatus::Retrying)
                .then_some("an earlier attempt was already sent and cannot be unsent; no further attempt runs"),
        },
        CancelRequest::Requested(status) => {
            nudge_turn(state, &id).await;
            CancelAnswer {
                execution_id: id,
                status,
                note: Some(
                    "the turn stops before its next model call (a model call under way is not cut short); its status becomes cancelled then",
                ),
            }
        }
    };
    Ok(answer)
}

/// Publishes the step the turn expects next, so a turn with no step in flight (waiting for a slow
/// tool) sees the cancel now rather than when its tools answer. A copy of a step that runs or ran
/// anyway is only acked by its claim. Best effort: without it the turn stops at its next step all
/// the same.
async fn nudge_turn(state: &AppState, id: &str) {
    let (Ok(Some(turn)), Ok(Some(expected))) =
        (state.store.sessions().load_turn(id).await, state.store.executions().expected(id).await)
    else {
        return;
    };
    let step = Job::Turn(TurnJob { session_id: turn.session_id.clone(), round: expected.step.round });
    let envelope = Envelope {
        gen: expected.step.gen,
        attempt: expected.step.attempt,
        ..Envelope::new(id.to_string(), step, now_ms())
    };
    if crate::routes::submit::publish(state, &envelope).await.is_err() {
        tracing::warn!(execution_id = %id, "cannot publish the cancelled turn's step; it stops at its next step");
    }
}

/// This module's routes, each with its OpenAPI operation (path, method, scope): adding a route
/// here is all it takes to serve, document and guard it.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(list_executions))
        .routes(utoipa_axum::routes!(get_execution))
        .routes(utoipa_axum::routes!(cancel_execution))
}
