//! Seed 000's data sources: `POST /v1/data-sources` registers a database or REST API (its
//! connection stored encrypted, never shown), and its check and schema extraction run as a job of
//! its tool `ds.{name}`; `…/query` runs one read-only query as a job of the same tool and answers
//! its rows; `…/semantic-mappings` describes tables and columns for the model; `…/refresh-schema`
//! extracts again. A data source is fleet configuration, as an MCP server is: operators only.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use fleet_platform::now_ms;
use fleet_platform::store::{
    ConnectionStatus, DataSourceVersion, SchemaStatus, SourceUpdate, StoredDataSource, StoredTool,
};
use fleet_protocol::data_sources::{
    self as ds, QueryLimits, QueryResult, SemanticMapping, SourceConnection, SourceType, Table,
};
use fleet_protocol::execution::ExecutionStatus;
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::tools::{DataSourceRef, ToolExecution};

use crate::error::ApiError;
use crate::routes::common::{page_limit, require_json, ApiQuery, Body, Page};
use crate::routes::submit::submit_job;
use crate::routes::tool_calls::ToolCallInput;
use crate::validate;
use crate::wire::{Data, Listed};
use crate::AppState;

/// How long a registration or a connection change waits for its check before answering.
const CHECK_WAIT: Duration = Duration::from_secs(20);
/// What a query's answer waits beyond its statement timeout (the job's own path and a retry).
const QUERY_SLACK: Duration = Duration::from_secs(10);

/// A data source's registration (seed 000's shape).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DataSourceInput {
    /// 1-48 letters, digits, `_` or `-`, unique in the fleet: its tool is `ds.{name}`.
    name: String,
    /// `postgresql`, `mysql` (MariaDB too) or `rest_api`.
    #[serde(rename = "type")]
    source_type: String,
    /// `{host, port, database, username, password}`, or for `rest_api` `{base_url, headers}`:
    /// stored encrypted; its secrets are never shown.
    connection: Value,
    description: Option<String>,
    /// The query limits (statement timeout, rows, bytes, connections); left out, the defaults.
    limits: Option<QueryLimits>,
}

/// A change: what is given is replaced (a new connection is checked and extracted again).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DataSourceUpdate {
    description: Option<String>,
    connection: Option<Value>,
    limits: Option<QueryLimits>,
}

/// One read-only query.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct QueryInput {
    /// One statement; `$1`, `$2`… are its parameters (for `rest_api`, a path and query string).
    query: String,
    /// Positional values for `$1`, `$2`…, bound by the driver (never spliced into the text).
    parameters: Option<Vec<Value>>,
}

/// Descriptions and synonyms for tables (`orders`) and columns (`orders.total_amount`), merged
/// over those the source has.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MappingsInput {
    /// A key set to `null` removes its mapping.
    #[schema(value_type = BTreeMap<String, SemanticMapping>)]
    mappings: BTreeMap<String, Option<SemanticMapping>>,
}

/// A data source as the API shows it (its connection without secrets).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = DataSource)]
pub(crate) struct DataSourceOut {
    id: String,
    name: String,
    #[serde(rename = "type")]
    source_type: SourceType,
    description: String,
    /// `checking`, `connected` or `error`.
    #[schema(value_type = String)]
    status: ConnectionStatus,
    /// `extracting`, `ready` or `failed`.
    #[schema(value_type = String)]
    schema_status: SchemaStatus,
    /// Why its last check or extraction failed.
    error: Option<String>,
    connection: Value,
    limits: QueryLimits,
    tables: Vec<Table>,
    semantic_mappings: BTreeMap<String, SemanticMapping>,
    /// The tool a model calls to query it (enable it for an assistant like any tool).
    tool_name: String,
    created_at: String,
    updated_at: String,
}

impl From<&StoredDataSource> for DataSourceOut {
    fn from(s: &StoredDataSource) -> Self {
        DataSourceOut {
            id: s.id.clone(),
            name: s.name.clone(),
            source_type: s.connection.source_type(),
            description: s.description.clone(),
            status: s.status,
            schema_status: s.schema_status,
            error: s.error.clone(),
            connection: shown(&s.connection.shown()),
            limits: s.limits,
            tables: s.tables.clone(),
            semantic_mappings: s.mappings.clone(),
            tool_name: ds::tool_name(&s.name),
            created_at: rfc3339_from_millis(s.created_at_ms),
            updated_at: rfc3339_from_millis(s.updated_at_ms),
        }
    }
}

fn no_source(id: &str) -> ApiError {
    ApiError::not_found(format!("no data source {id:?}"))
}

/// The type, refused with a 422 naming it when this fleet cannot reach it.
fn source_type(text: &str) -> Result<SourceType, ApiError> {
    SourceType::parse(text)
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "data_source_type_unsupported", e.to_string()))
}

/// A connection as the API shows it: its fields, secrets as `****`.
fn shown(connection: &SourceConnection) -> Value {
    let value = serde_json::to_value(connection).expect("a connection serialises");
    value.get("connection").cloned().unwrap_or(value)
}

/// The connection checked for its type, sealed for storage.
fn sealed_connection(
    state: &AppState,
    id: &str,
    kind: SourceType,
    connection: &Value,
) -> Result<fleet_protocol::data_sources::SealedConnection, ApiError> {
    let parsed =
        SourceConnection::from_parts(kind, connection.clone()).map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok(parsed.seal(&state.config.secrets_key, &StoredDataSource::connection_owner(id)))
}

/// The checks a registration passes before anything is stored (pure).
fn check(input: &DataSourceInput) -> Result<SourceType, ApiError> {
    let n = &input.name;
    if n.is_empty() || n.len() > 48 || !fleet_protocol::tools::is_plain_tool_name(n) {
        return Err(ApiError::invalid("name must be 1-48 letters, digits, '_' or '-'"));
    }
    check_settings(input.description.as_deref(), input.limits.as_ref())?;
    source_type(&input.source_type)
}

/// A registration's or a change's description and limits, checked (pure).
fn check_settings(description: Option<&str>, limits: Option<&QueryLimits>) -> Result<(), ApiError> {
    if description.is_some_and(|d| d.chars().count() > 4000) {
        return Err(ApiError::invalid("description must be at most 4000 characters"));
    }
    if let Some(limits) = limits {
        limits.validate().map_err(|e| ApiError::invalid(format!("limits: {e}")))?;
    }
    Ok(())
}

/// The source's tool: its description tells the model the schema and the mappings.
fn tool_of(source: &StoredDataSource, now: i64) -> StoredTool {
    StoredTool {
        id: fleet_protocol::tools::new_tool_id(),
        name: ds::tool_name(&source.name),
        description: source.tool_description(),
        parameters: ds::query_tool_parameters(),
        callback_url: String::new(),
        secret_ciphertext: String::new(),
        created_at_ms: now,
        updated_at_ms: now,
        signing: Default::default(),
        retry: None,
        limits: Default::default(),
        circuit_breaker: None,
        execution: ToolExecution::DataSource(DataSourceRef { source_id: source.id.clone() }),
        output_schema: None,
        approvals: fleet_protocol::approvals::ApprovalSettings {
            effects: vec![fleet_protocol::approvals::Effect::Read],
            ..Default::default()
        },
    }
}

/// Submits one job of the source's tool (a check and extraction, or a query): its execution id.
async fn submit_call(
    state: &AppState,
    source: &StoredDataSource,
    parameters: Map<String, Value>,
) -> Result<String, ApiError> {
    let input = ToolCallInput::internal(ds::tool_name(&source.name), parameters, source.tenant.clone());
    Ok(submit_job(state, None, &HeaderMap::new(), input).await?.execution_id)
}

/// Asks for the source's check and schema extraction.
async fn extract(state: &AppState, source: &StoredDataSource) -> Result<String, ApiError> {
    let parameters = json!({"operation": ds::EXTRACT_SCHEMA, "connection_version": source.connection_version});
    submit_call(state, source, parameters.as_object().cloned().unwrap_or_default()).await
}

/// The source once its check has an answer (or as it stands when `CHECK_WAIT` is over).
async fn checked(state: &AppState, id: &str) -> Result<StoredDataSource, ApiError> {
    let deadline = tokio::time::Instant::now() + CHECK_WAIT;
    loop {
        let found = state.store.registry().read_data_source(id).await?.ok_or_else(|| no_source(id))?;
        if found.source.status != ConnectionStatus::Checking || tokio::time::Instant::now() >= deadline {
            return Ok(found.source);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether a source of this name exists (names are few: the listing is read whole).
async fn name_taken(state: &AppState, name: &str) -> Result<bool, ApiError> {
    let all = state.store.registry().list_data_sources(None, 10_000).await?;
    Ok(all.iter().any(|s| s.name == name))
}

/// `POST /v1/data-sources`: registers a source and checks it at once (a job); 201 once connected,
/// 422 naming why it cannot be reached (nothing is kept then).
#[utoipa::path(post, path = "/v1/data-sources", extensions(("x-tenancy" = json!("operator"))), tag = "data-sources", security(("bearer" = ["tools:write", "operator"])),
    request_body(content = DataSourceInput, description = "The source (name, type and connection required)"),
    responses((status = 201, description = "Registered and checked; its schema is extracted by the same job", body = Data<DataSourceOut>),
        (status = 409, description = "A source of that name exists (`data_source_exists`) or its tool name is taken (`tool_exists`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn post_data_source(
    State(state): State<AppState>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<(StatusCode, Json<Data<DataSourceOut>>), ApiError> {
    require_json(&headers)?;
    let input: DataSourceInput = validate::parse_body(&body)?;
    let kind = check(&input)?;
    if name_taken(&state, &input.name).await? {
        let why = format!("a data source named {:?} is registered; DELETE it first to register it again", input.name);
        return Err(ApiError::new(StatusCode::CONFLICT, "data_source_exists", why));
    }
    let now = now_ms();
    let id = ds::new_data_source_id();
    let connection = sealed_connection(&state, &id, kind, &input.connection)?;
    let source = StoredDataSource {
        id: id.clone(),
        name: input.name,
        description: input.description.unwrap_or_default(),
        connection,
        limits: input.limits.unwrap_or_default(),
        status: ConnectionStatus::Checking,
        schema_status: SchemaStatus::Extracting,
        error: None,
        tables: vec![],
        mappings: BTreeMap::new(),
        tenant: None,
        connection_version: 1,
        created_at_ms: now,
        updated_at_ms: now,
    };
    let tool = tool_of(&source, now);
    if !state.store.registry().write_tool(&tool, None).await? {
        let why = format!("a tool named {:?} is registered: name the data source otherwise", tool.name);
        return Err(ApiError::new(StatusCode::CONFLICT, "tool_exists", why));
    }
    state.store.registry().write_data_source(&source, None).await?;
    if let Err(e) = extract(&state, &source).await {
        forget(&state, &source).await?;
        return Err(e);
    }
    let source = checked(&state, &id).await?;
    if source.status == ConnectionStatus::Error {
        forget(&state, &source).await?;
        let why = source.error.unwrap_or_else(|| "the data source cannot be reached".into());
        return Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "data_source_unreachable", why));
    }
    Ok((StatusCode::CREATED, Data::json(DataSourceOut::from(&source))))
}

/// Removes a source and its tool.
async fn forget(state: &AppState, source: &StoredDataSource) -> Result<(), ApiError> {
    let name = ds::tool_name(&source.name);
    let owned = state.store.registry().get_tool(&name).await?;
    if owned.is_some_and(|t| matches!(&t.execution, ToolExecution::DataSource(r) if r.source_id == source.id)) {
        state.store.registry().delete_tool(&name, None).await?;
        state.tool_schemas.forget(&name);
    }
    state.store.registry().delete_data_source(&source.id).await?;
    Ok(())
}

async fn read(state: &AppState, id: &str) -> Result<DataSourceVersion, ApiError> {
    state.store.registry().read_data_source(id).await?.ok_or_else(|| no_source(id))
}

#[utoipa::path(get, path = "/v1/data-sources", extensions(("x-tenancy" = json!("operator"))), tag = "data-sources", security(("bearer" = ["tools:read", "operator"])), params(crate::routes::common::Page),
    responses((status = 200, description = "Data sources by id", body = Listed<DataSourceOut>), crate::routes::docs::CommonErrors))]
pub(crate) async fn list_data_sources(
    State(state): State<AppState>,
    ApiQuery(page): ApiQuery<Page>,
) -> Result<Json<Listed<DataSourceOut>>, ApiError> {
    let limit = page_limit(page.limit)?;
    let sources = state.store.registry().list_data_sources(page.cursor.as_deref(), limit + 1).await?;
    let next = (sources.len() > limit).then(|| sources[limit - 1].id.clone());
    Ok(Listed::json(sources.iter().take(limit).map(DataSourceOut::from).collect(), next))
}

#[utoipa::path(get, path = "/v1/data-sources/{id}", extensions(("x-tenancy" = json!("operator"))), tag = "data-sources", security(("bearer" = ["tools:read", "operator"])),
    params(("id" = String, Path, description = "The source's id (`ds_…`)")),
    responses((status = 200, description = "The source, with its tables once its schema is ready", body = Data<DataSourceOut>),
        (status = 404, description = "No such source", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn get_data_source(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Data<DataSourceOut>>, ApiError> {
    Ok(Data::json(DataSourceOut::from(&read(&state, &id).await?.source)))
}

/// `PUT /v1/data-sources/{id}`: a new description, limits or connection (checked and extracted
/// again, the answer waiting for the check as a registration does).
#[utoipa::path(put, path = "/v1/data-sources/{id}", extensions(("x-tenancy" = json!("operator"))), tag = "data-sources", security(("bearer" = ["tools:write", "operator"])),
    params(("id" = String, Path, description = "The source's id")), request_body = DataSourceUpdate,
    responses((status = 200, description = "Changed", body = Data<DataSourceOut>),
        (status = 404, description = "No such source", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn put_data_source(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Json<Data<DataSourceOut>>, ApiError> {
    require_json(&headers)?;
    let input: DataSourceUpdate = validate::parse_body(&body)?;
    check_settings(input.description.as_deref(), input.limits.as_ref())?;
    let reconnect = input.connection.is_some();
    let source = update(&state, &id, |source| {
        if let Some(description) = &input.description {
            source.description = description.clone();
        }
        if let Some(limits) = &input.limits {
            source.limits = *limits;
        }
        if let Some(connection) = &input.connection {
            source.connection = sealed_connection(&state, &source.id, source.connection.source_type(), connection)?;
            source.connection_version += 1;
            source.status = ConnectionStatus::Checking;
            source.schema_status = SchemaStatus::Extracting;
            source.error = None;
        }
        Ok(())
    })
    .await?;
    let source = if reconnect {
        extract(&state, &source).await?;
        checked(&state, &id).await?
    } else {
        source
    };
    Ok(Data::json(DataSourceOut::from(&source)))
}

/// Applies `change` to the source and writes it if nothing changed it meanwhile (a few tries), its
/// tool's description kept in step.
async fn update(
    state: &AppState,
    id: &str,
    change: impl Fn(&mut StoredDataSource) -> Result<(), ApiError>,
) -> Result<StoredDataSource, ApiError> {
    let updated = state.store.registry().update_data_source(id, |source| change(source).map(|()| true)).await?;
    match updated {
        SourceUpdate::Written(source) => {
            state.tool_schemas.forget(&ds::tool_name(&source.name));
            Ok(*source)
        }
        SourceUpdate::Missing | SourceUpdate::Declined => Err(no_source(id)),
        SourceUpdate::KeptChanging => Err(ApiError::new(
            StatusCode::CONFLICT,
            "data_source_busy",
            format!("data source {id:?} kept changing; try again"),
        )),
    }
}

#[utoipa::path(delete, path = "/v1/data-sources/{id}", extensions(("x-tenancy" = json!("operator"))), tag = "data-sources", security(("bearer" = ["tools:write", "operator"])),
    params(("id" = String, Path, description = "The source's id")),
    responses((status = 204, description = "Deleted, with its tool"),
        (status = 404, description = "No such source", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn delete_data_source(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let found = read(&state, &id).await?;
    forget(&state, &found.source).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/data-sources/{id}/refresh-schema`: extracts its schema again (a job); 202.
#[utoipa::path(post, path = "/v1/data-sources/{id}/refresh-schema", extensions(("x-tenancy" = json!("operator"))), tag = "data-sources", security(("bearer" = ["tools:write", "operator"])),
    params(("id" = String, Path, description = "The source's id")),
    responses((status = 202, description = "Extracting: `schema_status` is `ready` or `failed` once the job ends", body = Data<DataSourceOut>),
        (status = 404, description = "No such source", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn refresh_schema(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Data<DataSourceOut>>), ApiError> {
    let source = update(&state, &id, |s| {
        s.schema_status = SchemaStatus::Extracting;
        Ok(())
    })
    .await?;
    extract(&state, &source).await?;
    Ok((StatusCode::ACCEPTED, Data::json(DataSourceOut::from(&source))))
}

/// `PATCH /v1/data-sources/{id}/semantic-mappings`: merged over the source's; a key naming no
/// table or column of its schema is a 422 naming it.
#[utoipa::path(patch, path = "/v1/data-sources/{id}/semantic-mappings", extensions(("x-tenancy" = json!("operator"))), tag = "data-sources", security(("bearer" = ["tools:write", "operator"])),
    params(("id" = String, Path, description = "The source's id")), request_body = MappingsInput,
    responses((status = 200, description = "Merged; the source's tool tells the model", body = Data<DataSourceOut>),
        (status = 404, description = "No such source", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn patch_mappings(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Json<Data<DataSourceOut>>, ApiError> {
    require_json(&headers)?;
    let input: MappingsInput = validate::parse_body(&body)?;
    let source = update(&state, &id, |source| {
        source.mappings = ds::merge_mappings(&source.mappings, &input.mappings, &source.tables).map_err(|e| {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "unknown_mapping_target", format!("mappings: {e}"))
        })?;
        Ok(())
    })
    .await?;
    Ok(Data::json(DataSourceOut::from(&source)))
}

/// `POST /v1/data-sources/{id}/query`: one read-only query, run by a worker as a job of the
/// source's tool; 200 with its rows, 422 naming why the database refused it.
#[utoipa::path(post, path = "/v1/data-sources/{id}/query", extensions(("x-tenancy" = json!("operator"))), tag = "data-sources", security(("bearer" = ["calls:write", "operator"])),
    params(("id" = String, Path, description = "The source's id")), request_body = QueryInput,
    responses((status = 200, description = "Its rows (capped: `truncated`)", body = Data<QueryResult>),
        (status = 422, description = "The database refused it (`read_only`, `statement_timeout`, …: the code names why)", body = crate::routes::docs::ErrorBody),
        (status = 404, description = "No such source", body = crate::routes::docs::ErrorBody),
        (status = 504, description = "Not answered in time (`query_pending`): its execution's record will say", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn query(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Json<Data<QueryResult>>, ApiError> {
    require_json(&headers)?;
    let input: QueryInput = validate::parse_body(&body)?;
    if input.query.trim().is_empty() {
        return Err(ApiError::invalid("query must not be empty"));
    }
    let source = read(&state, &id).await?.source;
    let parameters = json!({"query": input.query, "parameters": input.parameters.unwrap_or_default()});
    let execution = submit_call(&state, &source, parameters.as_object().cloned().unwrap_or_default()).await?;
    let wait = Duration::from_millis(source.limits.statement_timeout_ms) + QUERY_SLACK;
    answered(&state, &execution, wait).await.map(Data::json)
}

/// The query's rows once its execution ends, or why not. Its record is read at each of the
/// timer's ticks (1 ms: a 200 µs sleep ends at the next) for the first 10 ms (a query usually ends
/// within them; a read is one Redis trip), then ever less often.
async fn answered(state: &AppState, execution: &str, wait: Duration) -> Result<QueryResult, ApiError> {
    let started = tokio::time::Instant::now();
    let deadline = started + wait;
    let mut pause = Duration::from_micros(200);
    loop {
        if let Some(view) = state.store.executions().get_execution(execution).await? {
            let record = &view.record;
            match record.status {
                ExecutionStatus::Succeeded => {
                    return serde_json::from_value(view.result.clone().unwrap_or(Value::Null))
                        .map_err(|e| ApiError::new(StatusCode::BAD_GATEWAY, "query_result_unreadable", e.to_string()))
                }
                status if status.is_final() => return Err(refusal(record.last_error.as_deref(), execution)),
                _ => {}
            }
        }
        if tokio::time::Instant::now() >= deadline {
            let why = format!("the query is still running; GET /v1/executions/{execution} will show its outcome");
            return Err(ApiError::new(StatusCode::GATEWAY_TIMEOUT, "query_pending", why));
        }
        tokio::time::sleep(pause).await;
        if started.elapsed() > Duration::from_millis(10) {
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
}

/// A query the database (or the fleet) refused: 422 with the result's code (`read_only`, …).
fn refusal(last_error: Option<&str>, execution: &str) -> ApiError {
    let text = last_error.unwrap_or("the query failed");
    let (code, message) = text.split_once(": ").unwrap_or(("query_failed", text));
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, api_code(code), format!("{message} (execution {execution})"))
}

/// The API's error code for a query's result code (the drivers' codes, else `query_failed`).
fn api_code(code: &str) -> &'static str {
    const KNOWN: [&str; 14] = [
        "bad_target",
        "unsupported_type",
        "private_address",
        "unreachable",
        "auth_failed",
        "busy",
        "timeout",
        "read_only",
        "database_error",
        "bad_parameter",
        "unsupported_value",
        "too_large",
        "bad_answer",
        "connection_lost",
    ];
    KNOWN.into_iter().find(|k| k.eq_ignore_ascii_case(code)).unwrap_or("query_failed")
}

/// This module's routes, each with its OpenAPI operation.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(list_data_sources, post_data_source))
        .routes(utoipa_axum::routes!(get_data_source, put_data_source, delete_data_source))
        .routes(utoipa_axum::routes!(refresh_schema))
        .routes(utoipa_axum::routes!(query))
        .routes(utoipa_axum::routes!(patch_mappings))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(body: Value) -> DataSourceInput {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn registrations_are_checked_before_anything_is_stored() {
        let ok =
            json!({"name": "sales", "type": "postgresql", "connection": {}, "limits": {"statement_timeout_ms": 1000}});
        assert!(check(&input(ok)).is_ok());
        let e = check(&input(json!({"name": "a.b", "type": "postgresql", "connection": {}}))).unwrap_err();
        assert!(e.message.contains("name"), "{}", e.message);
        let e = check(&input(json!({"name": "m", "type": "mongodb", "connection": {}}))).unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::UNPROCESSABLE_ENTITY, "data_source_type_unsupported"));
        assert!(e.message.contains("mongodb"), "{}", e.message);
    }

    #[test]
    fn a_refused_query_names_its_code() {
        let e = refusal(Some("read_only: cannot execute INSERT in a read-only transaction"), "exec_1");
        assert_eq!((e.status, e.code), (StatusCode::UNPROCESSABLE_ENTITY, "read_only"));
        assert_eq!(refusal(Some("whatever"), "exec_1").code, "query_failed");
        assert!(e.message.contains("read-only transaction"), "{}", e.message);
    }
}
