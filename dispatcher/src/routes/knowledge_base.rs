//! Seed 000's "Knowledge Base Search": the services an assistant can connect to, searched, looked
//! up, and an OAuth service's configuration. They are the operator's catalog file
//! (`FLEET_SERVICES_CATALOG`, read once at start), then each registered MCP server and each
//! callback tool, read from the registry at every request so a server registered a moment ago is
//! found at once. Every route only reads; a search is a `POST` because the seed's is.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::Deserialize;
use utoipa::ToSchema;

use fleet_platform::store::{StoredMcpServer, StoredTool};

use crate::error::ApiError;
use crate::knowledge_base::catalog::{self, ServiceMatches, ServiceOAuthOut, ServiceOut};
use crate::knowledge_base::index::IndexError;
use crate::routes::common::{require_json, Body, Tenancy};
use crate::validate;
use crate::wire::Data;
use crate::AppState;

const DEFAULT_LIMIT: usize = 10;
const MAX_LIMIT: u32 = 50;
const MAX_QUERY_CHARS: usize = 1000;
/// Registry entries read at a time.
const PAGE: usize = 200;

/// A search of the services.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServiceSearch {
    /// What the service should do, in words (1-1000 characters, not only spaces), e.g.
    /// `calendar scheduling`.
    #[schema(min_length = 1, max_length = 1000, example = "calendar scheduling")]
    query: String,
    /// At most this many services (1-50, default 10).
    #[schema(minimum = 1, maximum = 50)]
    limit: Option<u32>,
}

/// A lookup of one service.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServiceLookup {
    /// The service's id, as a search shows it.
    #[schema(min_length = 1, example = "google_calendar")]
    service_id: String,
}

/// How many services a search answers; 422 naming `query` or `limit` (pure).
fn search_limit(input: &ServiceSearch) -> Result<usize, ApiError> {
    if input.query.trim().is_empty() {
        return Err(ApiError::invalid("query must not be empty: say what the service should do, e.g. \"calendar\""));
    }
    if input.query.chars().count() > MAX_QUERY_CHARS {
        return Err(ApiError::invalid(format!("query is longer than {MAX_QUERY_CHARS} characters")));
    }
    match input.limit {
        None => Ok(DEFAULT_LIMIT),
        Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::invalid(format!("limit must be 1-{MAX_LIMIT}, not {n}"))),
    }
}

fn unknown_service(id: &str) -> ApiError {
    let shown: String = id.chars().take(80).collect();
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_service",
        format!("no service {shown:?}; POST /v1/knowledge-base/services/search finds services"),
    )
}

fn index_failed(e: IndexError) -> ApiError {
    tracing::error!(error = %e, "the services index failed");
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "the services could not be searched; try again")
}

async fn all_mcp_servers(state: &AppState) -> Result<Vec<StoredMcpServer>, ApiError> {
    let mut all = Vec::new();
    loop {
        let after = all.last().map(|s: &StoredMcpServer| s.name.clone());
        let page = state.store.registry().list_mcp_servers(after.as_deref(), PAGE).await?;
        let done = page.len() < PAGE;
        all.extend(page);
        if done {
            return Ok(all);
        }
    }
}

async fn all_tools(state: &AppState) -> Result<Vec<StoredTool>, ApiError> {
    let mut all = Vec::new();
    loop {
        let after = all.last().map(|t: &StoredTool| t.name.clone());
        let page = state.store.registry().list_tools(after.as_deref(), PAGE).await?;
        let done = page.len() < PAGE;
        all.extend(page.into_iter().map(|v| v.tool));
        if done {
            return Ok(all);
        }
    }
}

/// The service `id` names, as a search would show it: the catalog's, else an MCP server's, else
/// a callback tool's; 404 `unknown_service`.
async fn find(state: &AppState, id: &str) -> Result<ServiceOut, ApiError> {
    if let Some(entry) = state.config.services_catalog.iter().find(|e| e.id == id) {
        return Ok(ServiceOut::from_entry(entry));
    }
    if !catalog::is_service_id(id) {
        return Err(unknown_service(id));
    }
    let registry = state.store.registry();
    if let Some(server) = registry.get_mcp_server(id).await? {
        let mut tools = Vec::with_capacity(server.tools.len());
        for name in &server.tools {
            tools.extend(registry.get_tool(name).await?);
        }
        return Ok(ServiceOut::from_mcp_server(&server, &catalog::tool_descriptions(&server, &tools)));
    }
    match registry.get_tool(id).await? {
        Some(tool) if tool.execution.is_callback() => Ok(ServiceOut::from_tool(&tool)),
        _ => Err(unknown_service(id)),
    }
}

/// `POST /v1/knowledge-base/services/search`: the services best matching the query.
#[utoipa::path(post, path = "/v1/knowledge-base/services/search", extensions(("x-tenancy" = json!("own"))), tag = "knowledge-base", security(("bearer" = ["tools:read"])),
    request_body(content = ServiceSearch, description = "What to look for (query required)"),
    responses((status = 200, description = "Services ranked by relevance (BM25 over id, name, description and capabilities), best first", body = Data<ServiceMatches>),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn search_services(
    State(state): State<AppState>,
    _tenancy: Tenancy,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Json<Data<ServiceMatches>>, ApiError> {
    require_json(&headers)?;
    let input: ServiceSearch = validate::parse_body(&body)?;
    let limit = search_limit(&input)?;
    let services =
        catalog::assemble(&state.config.services_catalog, &all_mcp_servers(&state).await?, &all_tools(&state).await?);
    let index = state.services_index.index_of(services).await.map_err(index_failed)?;
    let found = index.search(&input.query, limit).map_err(index_failed)?;
    Ok(Data::json(ServiceMatches { services: found.into_iter().cloned().collect() }))
}

/// `POST /v1/knowledge-base/services/lookup`: one service by its id.
#[utoipa::path(post, path = "/v1/knowledge-base/services/lookup", extensions(("x-tenancy" = json!("own"))), tag = "knowledge-base", security(("bearer" = ["tools:read"])),
    request_body(content = ServiceLookup, description = "The service's id"),
    responses((status = 200, description = "The service", body = Data<ServiceOut>),
        (status = 404, description = "No such service (`unknown_service`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn lookup_service(
    State(state): State<AppState>,
    _tenancy: Tenancy,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Json<Data<ServiceOut>>, ApiError> {
    require_json(&headers)?;
    let input: ServiceLookup = validate::parse_body(&body)?;
    if input.service_id.trim().is_empty() {
        return Err(ApiError::invalid("service_id must not be empty"));
    }
    Ok(Data::json(find(&state, &input.service_id).await?))
}

#[utoipa::path(get, path = "/v1/knowledge-base/services/{id}", extensions(("x-tenancy" = json!("own"))), tag = "knowledge-base", security(("bearer" = ["tools:read"])),
    params(("id" = String, Path, description = "The service's id")),
    responses((status = 200, description = "The service", body = Data<ServiceOut>),
        (status = 404, description = "No such service (`unknown_service`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn get_service(
    State(state): State<AppState>,
    _tenancy: Tenancy,
    Path(id): Path<String>,
) -> Result<Json<Data<ServiceOut>>, ApiError> {
    Ok(Data::json(find(&state, &id).await?))
}

/// `GET /v1/knowledge-base/services/{id}/oauth`: an `oauth2` service's endpoints and scopes,
/// never a client secret; 409 `no_oauth` for a service that authenticates otherwise.
#[utoipa::path(get, path = "/v1/knowledge-base/services/{id}/oauth", extensions(("x-tenancy" = json!("own"))), tag = "knowledge-base", security(("bearer" = ["tools:read"])),
    params(("id" = String, Path, description = "The service's id")),
    responses((status = 200, description = "Its OAuth configuration", body = Data<ServiceOAuthOut>),
        (status = 404, description = "No such service (`unknown_service`)", body = crate::routes::docs::ErrorBody),
        (status = 409, description = "The service does not use OAuth 2.0 (`no_oauth`, naming its `auth_type`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn service_oauth(
    State(state): State<AppState>,
    _tenancy: Tenancy,
    Path(id): Path<String>,
) -> Result<Json<Data<ServiceOAuthOut>>, ApiError> {
    let service = find(&state, &id).await?;
    // Only a catalog entry has OAuth endpoints, and `find` answers one whenever it holds the id.
    let entry = state.config.services_catalog.iter().find(|e| e.id == service.id);
    entry.and_then(ServiceOAuthOut::of).map(Data::json).ok_or_else(|| {
        let why = format!(
            "service {:?} authenticates with {}, not oauth2: it has no OAuth configuration",
            service.id,
            service.auth_type.as_str()
        );
        ApiError::new(StatusCode::CONFLICT, "no_oauth", why)
    })
}

/// This module's routes, each with its OpenAPI operation.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(search_services))
        .routes(utoipa_axum::routes!(lookup_service))
        .routes(utoipa_axum::routes!(get_service))
        .routes(utoipa_axum::routes!(service_oauth))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn search(body: serde_json::Value) -> Result<usize, ApiError> {
        search_limit(&validate::parse_body::<ServiceSearch>(body.to_string().as_bytes())?)
    }

    #[test]
    fn a_search_needs_a_query_and_a_limit_of_1_to_50() {
        assert_eq!(search(json!({"query": "calendar scheduling", "limit": 5})).unwrap(), 5);
        assert_eq!(search(json!({"query": "calendar"})).unwrap(), DEFAULT_LIMIT);
        for (body, says) in [
            (json!({"query": "  "}), "query must not be empty"),
            (json!({"query": ""}), "query must not be empty"),
            (json!({}), "missing field `query`"),
            (json!({"query": "x", "limit": 0}), "limit must be 1-50, not 0"),
            (json!({"query": "x", "limit": 51}), "limit must be 1-50, not 51"),
            (json!({"query": "x", "limit": -1}), "limit: invalid value"),
            (json!({"query": "x", "limit": "5"}), "limit: invalid type"),
            (json!({"query": "x".repeat(1001)}), "query is longer"),
            (json!({"query": "x", "filter": 1}), "unknown field `filter`"),
        ] {
            let e = search(body).unwrap_err();
            assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY, "{says}");
            assert!(e.message.contains(says), "{says}: {}", e.message);
        }
    }

    #[test]
    fn an_unknown_service_is_named_and_its_id_cut_short() {
        let e = unknown_service("nope");
        assert_eq!((e.status, e.code), (StatusCode::NOT_FOUND, "unknown_service"));
        assert!(e.message.starts_with("no service \"nope\""), "{}", e.message);
        assert!(unknown_service(&"y".repeat(500)).message.len() < 200);
    }
}
