//! Dead letters: listing and reading them, and retrying or deleting one or many.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use fleet_platform::dead_letters;
use fleet_protocol::deadletter::{DeadLetterFilter, DeadLetterReason, ListCursor};
use fleet_protocol::execution::ExecutionStatus;

use crate::error::ApiError;
use crate::routes::common::{page_limit, ApiQuery, Body};
use crate::{validate, AppState};

#[utoipa::path(get, path = "/v1/dead-letters/{id}", tag = "dead-letters", security(("bearer" = ["dead_letters:read"])),
    params(("id" = String, Path, description = "The dead letter's execution id")),
    responses((status = 200, description = "The dead letter", body = crate::routes::docs::DeadLetterResponse),
        (status = 404, description = "No such dead letter", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn get_dead_letter(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let record = state
        .store
        .get_dead_letter(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no dead letter for {id:?}")))?;
    Ok(Json(json!({"data": record})))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct DeadLetterQuery {
    cursor: Option<String>,
    /// 1-200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<usize>,
    tool_name: Option<String>,
    #[param(value_type = Option<crate::routes::docs::DeadLetterReasonDoc>)]
    reason: Option<DeadLetterReason>,
    /// RFC 3339.
    since: Option<String>,
    /// RFC 3339.
    until: Option<String>,
}

/// Newest first, filtered by tool, reason and time range; `next_cursor` continues the listing. One
/// request looks at a bounded number of index entries: a page may come back short (even empty)
/// with a `next_cursor` when few match, and only `next_cursor: null` means the end.
#[utoipa::path(get, path = "/v1/dead-letters", tag = "dead-letters", security(("bearer" = ["dead_letters:read"])),
    params(DeadLetterQuery),
    responses((status = 200, description = "Dead letters, newest first", body = crate::routes::docs::DeadLetterList), crate::routes::docs::CommonErrors))]
pub(crate) async fn list_dead_letters(
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<DeadLetterQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(q.limit)?;
    let filter = DeadLetterFilter {
        execution_ids: vec![],
        tool_name: q.tool_name,
        reason: q.reason,
        since: q.since,
        until: q.until,
    };
    filter.validate().map_err(|field| ApiError::invalid(format!("{field} must be an RFC 3339 timestamp")))?;
    let cursor = match q.cursor.as_deref() {
        Some(c) => {
            Some(ListCursor::parse(c).ok_or_else(|| ApiError::invalid("cursor is not a cursor this API returned"))?)
        }
        None => None,
    };
    let (records, next) =
        dead_letters::list(&state.store, &filter, cursor, limit, LIST_SCAN_BUDGET).await.map_err(dead_letter_error)?;
    Ok(Json(json!({"data": records, "next_cursor": next.map(|c| c.to_string())})))
}

/// Index entries one listing request looks at, at most.
const LIST_SCAN_BUDGET: usize = 5_000;

fn dead_letter_error(e: dead_letters::SweepError) -> ApiError {
    match e {
        dead_letters::SweepError::Store(e) => ApiError::from(e),
        other => {
            tracing::warn!(error = %other, "dead-letter operation failed");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "broker_unavailable",
                format!("dead-letter operation failed: {other}"),
            )
        }
    }
}

/// Applies `action` to the dead letters `filter` matches (bulk, or one when it names one id).
async fn apply(
    state: &AppState,
    filter: &DeadLetterFilter,
    action: dead_letters::Action,
    limit: Option<u64>,
    per_second: Option<f64>,
) -> Result<dead_letters::SweepReport, ApiError> {
    let publisher = match action {
        dead_letters::Action::Retry => Some(state.broker.publisher()?),
        dead_letters::Action::Delete => None,
    };
    let redrive = publisher
        .as_ref()
        .map(|publisher| dead_letters::Redrive { publisher, topology: &state.config.common.topology });
    dead_letters::apply(&state.store, redrive.as_ref(), filter, action, limit, per_second)
        .await
        .map_err(dead_letter_error)
}

async fn act_on(state: &AppState, id: &str, action: dead_letters::Action) -> Result<dead_letters::Outcome, ApiError> {
    let publisher = match action {
        dead_letters::Action::Retry => Some(state.broker.publisher()?),
        dead_letters::Action::Delete => None,
    };
    let redrive = publisher
        .as_ref()
        .map(|publisher| dead_letters::Redrive { publisher, topology: &state.config.common.topology });
    dead_letters::act_on(&state.store, redrive.as_ref(), id, action).await.map_err(dead_letter_error)
}

fn busy(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "dead_letter_busy",
        format!("dead letter {id:?} is being retried or deleted by another request"),
    )
}

#[utoipa::path(post, path = "/v1/dead-letters/{id}/retry", tag = "dead-letters", security(("bearer" = ["dead_letters:admin"])),
    params(("id" = String, Path, description = "The dead letter's execution id")),
    responses((status = 202, description = "Back on the work queue", body = crate::routes::docs::AcceptedResponse),
        (status = 404, description = "No such dead letter", body = crate::routes::docs::ErrorBody),
        (status = 409, description = "Poison (`not_replayable`) or busy (`dead_letter_busy`)", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn retry_dead_letter(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    match act_on(&state, &id, dead_letters::Action::Retry).await? {
        dead_letters::Outcome::Done => Ok((
            StatusCode::ACCEPTED,
            Json(json!({"data": {"execution_id": id, "status": ExecutionStatus::Queued.as_str()}})),
        )
            .into_response()),
        dead_letters::Outcome::NotReplayable => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_replayable",
            format!("dead letter {id:?} is a poison message: there is no job to retry"),
        )),
        dead_letters::Outcome::Busy => Err(busy(&id)),
        dead_letters::Outcome::NotFound => Err(ApiError::not_found(format!("no dead letter for {id:?}"))),
    }
}

#[utoipa::path(delete, path = "/v1/dead-letters/{id}", tag = "dead-letters", security(("bearer" = ["dead_letters:admin"])),
    params(("id" = String, Path, description = "The dead letter's execution id")),
    responses((status = 204, description = "Deleted"),
        (status = 404, description = "No such dead letter", body = crate::routes::docs::ErrorBody),
        (status = 409, description = "Another request is acting on it (`dead_letter_busy`)", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn delete_dead_letter(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    match act_on(&state, &id, dead_letters::Action::Delete).await? {
        dead_letters::Outcome::Done => Ok(StatusCode::NO_CONTENT),
        dead_letters::Outcome::Busy => Err(busy(&id)),
        _ => Err(ApiError::not_found(format!("no dead letter for {id:?}"))),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BulkRequest {
    #[serde(flatten)]
    filter: BulkFilter,
    limit: Option<u64>,
    rate_per_second: Option<f64>,
}

#[derive(Deserialize, Default)]
struct BulkFilter {
    #[serde(default)]
    execution_ids: Vec<String>,
    tool_name: Option<String>,
    reason: Option<DeadLetterReason>,
    since: Option<String>,
    until: Option<String>,
}

fn bulk_request(body: &[u8]) -> Result<(DeadLetterFilter, Option<u64>, Option<f64>), ApiError> {
    let req: BulkRequest = if body.is_empty() { BulkRequest::default() } else { validate::parse_body(body)? };
    let f = req.filter;
    let filter = DeadLetterFilter {
        execution_ids: f.execution_ids,
        tool_name: f.tool_name,
        reason: f.reason,
        since: f.since,
        until: f.until,
    };
    filter.validate().map_err(|field| ApiError::invalid(format!("{field} must be an RFC 3339 timestamp")))?;
    // The document says int64: a larger limit is refused rather than read as "no limit".
    if req.limit.is_some_and(|n| n > i64::MAX as u64) {
        return Err(ApiError::invalid("limit must be at most 9223372036854775807"));
    }
    if req.rate_per_second.is_some_and(|r| !(r > 0.0 && r <= 10_000.0)) {
        return Err(ApiError::invalid("rate_per_second must be between 0 and 10000"));
    }
    Ok((filter, req.limit, req.rate_per_second))
}

/// Bulk redrive: every matching dead letter back to the work queue, at a bounded rate (default 50/s).
#[utoipa::path(post, path = "/v1/dead-letters/retry", tag = "dead-letters", security(("bearer" = ["dead_letters:admin"])),
    request_body(content = crate::routes::docs::BulkRequestDoc, description = "Which dead letters (an empty body: all)"),
    responses((status = 200, description = "What was retried", body = crate::routes::docs::SweepResponse), crate::routes::docs::CommonErrors))]
pub(crate) async fn retry_dead_letters(
    State(state): State<AppState>,
    Body(body): Body,
) -> Result<Json<Value>, ApiError> {
    let (filter, limit, rate) = bulk_request(&body)?;
    let report = apply(&state, &filter, dead_letters::Action::Retry, limit, Some(rate.unwrap_or(50.0))).await?;
    Ok(Json(json!({"data": report})))
}

#[utoipa::path(post, path = "/v1/dead-letters/purge", tag = "dead-letters", security(("bearer" = ["dead_letters:admin"])),
    request_body(content = crate::routes::docs::BulkRequestDoc, description = "Which dead letters (an empty body: all)"),
    responses((status = 200, description = "What was deleted", body = crate::routes::docs::SweepResponse), crate::routes::docs::CommonErrors))]
pub(crate) async fn purge_dead_letters(
    State(state): State<AppState>,
    Body(body): Body,
) -> Result<Json<Value>, ApiError> {
    let (filter, limit, _) = bulk_request(&body)?;
    let report = apply(&state, &filter, dead_letters::Action::Delete, limit, None).await?;
    Ok(Json(json!({"data": report})))
}
