//! Dead letters: listing and reading them, and retrying or deleting one or many.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Extension;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

use fleet_platform::dead_letters;
use fleet_protocol::dead_letters::{DeadLetterFilter, DeadLetterReason, DeadLetterRecord, ListCursor};
use fleet_protocol::execution::ExecutionStatus;

use crate::error::ApiError;
use crate::routes::audit;
use crate::routes::common::{page_limit, ApiQuery, Body, Caller, Tenancy};
use crate::routes::submit::AcceptedJob;
use crate::wire::{Data, Listed};
use crate::{validate, AppState};

#[utoipa::path(get, path = "/v1/dead-letters/{id}", extensions(("x-tenancy" = json!("resource"))), tag = "dead-letters", security(("bearer" = ["dead_letters:read"])),
    params(("id" = String, Path, description = "The dead letter's execution id")),
    responses((status = 200, description = "The dead letter", body = Data<DeadLetterRecord>),
        (status = 404, description = "No such dead letter", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn get_dead_letter(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path(id): Path<String>,
) -> Result<Json<Data<DeadLetterRecord>>, ApiError> {
    visible(&state, &tenancy, &id).await?;
    let record = state
        .store
        .dead_letters()
        .get_dead_letter(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no dead letter for {id:?}")))?;
    Ok(Data::json(record))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct DeadLetterQuery {
    cursor: Option<String>,
    /// 1-200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<usize>,
    tool_name: Option<String>,
    #[param(value_type = Option<fleet_protocol::envelope::DeadLetterReason>)]
    reason: Option<DeadLetterReason>,
    /// RFC 3339.
    since: Option<String>,
    /// RFC 3339.
    until: Option<String>,
}

/// Newest first, filtered by tool, reason and time range; `next_cursor` continues the listing. One
/// request looks at a bounded number of index entries: a page may come back short (even empty)
/// with a `next_cursor` when few match, and only `next_cursor: null` means the end.
#[utoipa::path(get, path = "/v1/dead-letters", extensions(("x-tenancy" = json!("listing"))), tag = "dead-letters", security(("bearer" = ["dead_letters:read"])),
    params(DeadLetterQuery),
    responses((status = 200, description = "Dead letters, newest first", body = Listed<DeadLetterRecord>), crate::routes::docs::CommonErrors))]
pub(crate) async fn list_dead_letters(
    State(state): State<AppState>,
    tenancy: Tenancy,
    ApiQuery(q): ApiQuery<DeadLetterQuery>,
) -> Result<Json<Listed<DeadLetterRecord>>, ApiError> {
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
    let records = only_visible(&state, &tenancy, records).await?;
    Ok(Listed::json(records, next.map(|c| c.to_string())))
}

/// A tenant-bound caller's request about dead letter `id`: 404 unless its execution is the
/// caller's tenant's (one whose record is gone is no tenant's). An unbound caller costs no read.
async fn visible(state: &AppState, tenancy: &Tenancy, id: &str) -> Result<(), ApiError> {
    if tenancy.bound.is_none() {
        return Ok(());
    }
    let owner = owners(state, &[id]).await?.pop().flatten();
    if !tenancy.sees(owner.as_deref()) || owner.is_none() {
        return Err(ApiError::not_found(format!("no dead letter for {id:?}")));
    }
    Ok(())
}

/// The tenants of dead letters `ids`: each one's stamped tenant, else (a dead letter stored before
/// records carried one) its execution's while that record lives.
async fn owners(state: &AppState, ids: &[&str]) -> Result<Vec<Option<String>>, ApiError> {
    let owned: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
    let stamped = state.store.dead_letters().get_dead_letters(&owned).await?;
    let mut owners: Vec<Option<String>> = stamped.into_iter().map(|r| r.and_then(|r| r.tenant)).collect();
    let missing: Vec<&str> = ids.iter().zip(&owners).filter(|(_, o)| o.is_none()).map(|(id, _)| *id).collect();
    let mut looked_up = state.store.executions().execution_tenants(&missing).await?.into_iter();
    for owner in owners.iter_mut().filter(|o| o.is_none()) {
        *owner = looked_up.next().flatten();
    }
    Ok(owners)
}

/// The records a tenant-bound caller may see (a page may so come back short, as it may anyway).
async fn only_visible(
    state: &AppState,
    tenancy: &Tenancy,
    records: Vec<DeadLetterRecord>,
) -> Result<Vec<DeadLetterRecord>, ApiError> {
    if tenancy.bound.is_none() {
        return Ok(records);
    }
    let ids: Vec<&str> =
        records.iter().filter(|r| r.tenant.is_none()).map(|r| r.execution_id.as_deref().unwrap_or("")).collect();
    let mut looked_up = state.store.executions().execution_tenants(&ids).await?.into_iter();
    let owners: Vec<Option<String>> = records
        .iter()
        .map(|r| if r.tenant.is_some() { r.tenant.clone() } else { looked_up.next().flatten() })
        .collect();
    Ok(records
        .into_iter()
        .zip(owners)
        .filter(|(_, o)| o.is_some() && tenancy.sees(o.as_deref()))
        .map(|(r, _)| r)
        .collect())
}

/// A tenant-bound caller's bulk operation acts only on the dead letters it names, and of those
/// only on its tenant's (the others are as if they did not exist).
async fn bulk_scope(state: &AppState, tenancy: &Tenancy, filter: &mut DeadLetterFilter) -> Result<(), ApiError> {
    if tenancy.bound.is_none() {
        return Ok(());
    }
    if filter.execution_ids.is_empty() {
        return Err(ApiError::invalid("a tenant-bound token names the dead letters it acts on (execution_ids)"));
    }
    let ids: Vec<&str> = filter.execution_ids.iter().map(String::as_str).collect();
    let owners = owners(state, &ids).await?;
    let mine: Vec<String> = filter
        .execution_ids
        .iter()
        .zip(owners)
        .filter(|(_, o)| o.is_some() && tenancy.sees(o.as_deref()))
        .map(|(id, _)| id.clone())
        .collect();
    // None of them the caller's: a filter that matches nothing (an id no dead letter has).
    filter.execution_ids = if mine.is_empty() { vec![String::new()] } else { mine };
    Ok(())
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

async fn act_on(
    state: &AppState,
    id: &str,
    action: dead_letters::Action,
) -> Result<dead_letters::LetterOutcome, ApiError> {
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

#[utoipa::path(post, path = "/v1/dead-letters/{id}/retry", extensions(("x-tenancy" = json!("resource"))), tag = "dead-letters", security(("bearer" = ["dead_letters:admin"])),
    params(("id" = String, Path, description = "The dead letter's execution id")),
    responses((status = 202, description = "Back on the work queue", body = Data<AcceptedJob>),
        (status = 200, description = "The execution ended after the dead letter was made: nothing retried, the stale dead letter removed", body = Data<AcceptedJob>),
        (status = 404, description = "No such dead letter", body = crate::routes::docs::ErrorBody),
        (status = 409, description = "Poison (`not_replayable`), replayed already (`execution_live`) or busy (`dead_letter_busy`)", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn retry_dead_letter(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    tenancy: Tenancy,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Data<AcceptedJob>>), ApiError> {
    visible(&state, &tenancy, &id).await?;
    let outcome = act_on(&state, &id, dead_letters::Action::Retry).await?;
    if matches!(outcome, dead_letters::LetterOutcome::Done)
        || matches!(outcome, dead_letters::LetterOutcome::Superseded(s) if s.is_final())
    {
        let stale = json!({"stale": !matches!(outcome, dead_letters::LetterOutcome::Done)});
        audit::record_api(&state, caller.as_deref(), "dead_letter.retry", &id, 1, Some(&stale)).await;
    }
    match outcome {
        dead_letters::LetterOutcome::Done => {
            Ok((StatusCode::ACCEPTED, Data::json(AcceptedJob::new(id, ExecutionStatus::Queued))))
        }
        dead_letters::LetterOutcome::NotReplayable => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_replayable",
            format!("dead letter {id:?} is a poison message: there is no job to retry"),
        )),
        dead_letters::LetterOutcome::Superseded(status) if status.is_final() => Ok((
            StatusCode::OK,
            Data::json(AcceptedJob {
                note: Some(
                    "the execution ended after this dead letter was made; nothing was retried and the stale dead letter is removed",
                ),
                ..AcceptedJob::new(id, status)
            }),
        )),
        dead_letters::LetterOutcome::Superseded(status) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "execution_live",
            format!("execution {id:?} is {} again (replayed already): it is not retried twice", status.as_str()),
        )),
        dead_letters::LetterOutcome::Busy => Err(busy(&id)),
        dead_letters::LetterOutcome::NotFound => Err(ApiError::not_found(format!("no dead letter for {id:?}"))),
    }
}

#[utoipa::path(delete, path = "/v1/dead-letters/{id}", extensions(("x-tenancy" = json!("resource"))), tag = "dead-letters", security(("bearer" = ["dead_letters:admin"])),
    params(("id" = String, Path, description = "The dead letter's execution id")),
    responses((status = 204, description = "Deleted"),
        (status = 404, description = "No such dead letter", body = crate::routes::docs::ErrorBody),
        (status = 409, description = "Another request is acting on it (`dead_letter_busy`)", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn delete_dead_letter(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    tenancy: Tenancy,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    visible(&state, &tenancy, &id).await?;
    match act_on(&state, &id, dead_letters::Action::Delete).await? {
        dead_letters::LetterOutcome::Done => {
            audit::record_api(&state, caller.as_deref(), "dead_letter.delete", &id, 1, None).await;
            Ok(StatusCode::NO_CONTENT)
        }
        dead_letters::LetterOutcome::Busy => Err(busy(&id)),
        _ => Err(ApiError::not_found(format!("no dead letter for {id:?}"))),
    }
}

/// Which dead letters a bulk operation acts on (all filters optional; an empty body matches all).
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BulkRequest {
    #[serde(default)]
    execution_ids: Vec<String>,
    tool_name: Option<String>,
    reason: Option<DeadLetterReason>,
    /// RFC 3339.
    since: Option<String>,
    until: Option<String>,
    /// At most this many.
    limit: Option<u64>,
    /// Retries per second (0 < r <= 10000; default 50).
    rate_per_second: Option<f64>,
}

fn bulk_request(body: &[u8]) -> Result<(DeadLetterFilter, Option<u64>, Option<f64>), ApiError> {
    let req: BulkRequest = if body.is_empty() { BulkRequest::default() } else { validate::parse_body(body)? };
    let filter = DeadLetterFilter {
        execution_ids: req.execution_ids,
        tool_name: req.tool_name,
        reason: req.reason,
        since: req.since,
        until: req.until,
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
#[utoipa::path(post, path = "/v1/dead-letters/retry", extensions(("x-tenancy" = json!("bulk"))), tag = "dead-letters", security(("bearer" = ["dead_letters:admin"])),
    request_body(content = BulkRequest, description = "Which dead letters (an empty body: all)"),
    responses((status = 200, description = "What was retried", body = Data<dead_letters::SweepReport>), crate::routes::docs::CommonErrors))]
pub(crate) async fn retry_dead_letters(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    tenancy: Tenancy,
    Body(body): Body,
) -> Result<Json<Data<dead_letters::SweepReport>>, ApiError> {
    bulk(&state, caller, tenancy, &body, dead_letters::Action::Retry).await
}

#[utoipa::path(post, path = "/v1/dead-letters/purge", extensions(("x-tenancy" = json!("bulk"))), tag = "dead-letters", security(("bearer" = ["dead_letters:admin"])),
    request_body(content = BulkRequest, description = "Which dead letters (an empty body: all)"),
    responses((status = 200, description = "What was deleted", body = Data<dead_letters::SweepReport>), crate::routes::docs::CommonErrors))]
pub(crate) async fn purge_dead_letters(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    tenancy: Tenancy,
    Body(body): Body,
) -> Result<Json<Data<dead_letters::SweepReport>>, ApiError> {
    bulk(&state, caller, tenancy, &body, dead_letters::Action::Delete).await
}

/// A bulk operation through the API: the body's filter (narrowed to the caller's tenant), the
/// action (a redrive at its rate, default 50/s; a purge at once), its audit entry, and the report.
async fn bulk(
    state: &AppState,
    caller: Option<Extension<Caller>>,
    tenancy: Tenancy,
    body: &[u8],
    action: dead_letters::Action,
) -> Result<Json<Data<dead_letters::SweepReport>>, ApiError> {
    let (mut filter, limit, rate) = bulk_request(body)?;
    bulk_scope(state, &tenancy, &mut filter).await?;
    let (rate, name) = match action {
        dead_letters::Action::Retry => (Some(rate.unwrap_or(50.0)), "dead_letters.redrive"),
        dead_letters::Action::Delete => (None, "dead_letters.purge"),
    };
    let report = apply(state, &filter, action, limit, rate).await?;
    audit_bulk(state, caller, name, &filter, &report).await;
    Ok(Data::json(report))
}

/// Writes a bulk operation (its filter and report) to the audit log.
async fn audit_bulk(
    state: &AppState,
    caller: Option<Extension<Caller>>,
    action: &str,
    filter: &DeadLetterFilter,
    report: &dead_letters::SweepReport,
) {
    let detail = serde_json::to_value(report).unwrap_or(Value::Null);
    let (target, count) = (filter.describe(), report.done);
    audit::record_api(state, caller.as_deref(), action, &target, count, Some(&detail)).await;
}

/// This module's routes, each with its OpenAPI operation (path, method, scope): adding a route
/// here is all it takes to serve, document and guard it.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(list_dead_letters))
        .routes(utoipa_axum::routes!(retry_dead_letters))
        .routes(utoipa_axum::routes!(purge_dead_letters))
        .routes(utoipa_axum::routes!(get_dead_letter, delete_dead_letter))
        .routes(utoipa_axum::routes!(retry_dead_letter))
}
