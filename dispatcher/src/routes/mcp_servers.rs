//! The MCP server registry's routes: `POST /v1/mcp_servers` registers a server and discovers its
//! tools at once (each becomes a tool, `server.tool`), `POST …/{name}/discover` discovers again.
//! Its headers are stored encrypted and shown by name only.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use fleet_platform::now_ms;
use fleet_platform::store::StoredMcpServer;
use fleet_protocol::circuit::CircuitBreaker;
use fleet_protocol::limits::{self, RateLimit, ToolLimits};
use fleet_protocol::retry_spec::RetrySpec;
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::tools::{is_plain_tool_name, is_tool_id};

use crate::error::ApiError;
use crate::mcp_discovery::{Discoverer, Refused};
use crate::routes::common::{page_limit, refuse_private_resolution, require_json, ApiQuery, Body, Page};
use crate::validate;
use crate::wire::{Data, Listed};
use crate::AppState;

/// Seed 002's discovery defaults: 100 pages, 1000 tools.
const DEFAULT_MAX_PAGES: u32 = fleet_protocol::mcp::DEFAULT_MAX_DISCOVERY_PAGES;
const DEFAULT_MAX_CAPABILITIES: u32 = fleet_protocol::mcp::DEFAULT_MAX_CAPABILITIES;
const MAX_HEADERS: usize = 32;

/// An MCP server's registration.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct McpServerInput {
    /// 1-32 letters, digits, `_` or `-`: its tools are named `name.tool`.
    name: String,
    /// Its streamable HTTP endpoint (http or https).
    url: String,
    /// Headers each request carries (a bearer token, say): stored encrypted, shown by name only.
    headers: Option<BTreeMap<String, String>>,
    /// Fleet names for some of its tools (MCP tool name → a plain tool name), instead of
    /// `name.tool`.
    tool_names: Option<BTreeMap<String, String>>,
    /// Pages of `tools/list` one discovery may read (1-1000, default 100).
    max_discovery_pages: Option<u32>,
    /// Tools one discovery may list (1-10000, default 1000).
    max_capabilities: Option<u32>,
    /// Calls in flight to each of its tools at once across the fleet (1-100000).
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 100000)]
    max_concurrency: Option<Value>,
    /// Calls per second to each of its tools across the fleet.
    #[schema(value_type = Option<RateLimit>)]
    rate_limit: Option<Value>,
    /// Its tools' retry schedule; left out, the fleet's default.
    retry: Option<RetrySpec>,
    /// Its tools' circuit breaker; left out, the fleet's settings.
    circuit_breaker: Option<CircuitBreaker>,
    /// The operator's policy: a call whose outcome is unknown (the connection dropped after the
    /// request went out) may be sent again. Without it only tools hinting `idempotentHint` or
    /// `readOnlyHint` are.
    retry_unknown: Option<bool>,
    /// Kept for the approvals of destructive tools (`destructiveHint`).
    requires_approval_for_destructive: Option<bool>,
}

/// An MCP server as the API shows it (its headers by name only).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = McpServer)]
pub(crate) struct McpServerOut {
    name: String,
    url: String,
    /// The names of the headers it is sent; their values are never shown.
    header_names: Vec<String>,
    tool_names: BTreeMap<String, String>,
    max_discovery_pages: u32,
    max_capabilities: u32,
    max_concurrency: Option<u32>,
    rate_limit: Option<RateLimit>,
    retry: Option<RetrySpec>,
    circuit_breaker: Option<CircuitBreaker>,
    retry_unknown: bool,
    requires_approval_for_destructive: bool,
    /// The fleet names of its tools, as its last discovery stored them.
    tools: Vec<String>,
    /// RFC 3339: its last successful discovery.
    discovered_at: String,
    /// Why its last scheduled discovery failed, if it did (its tools were kept).
    last_error: Option<String>,
    created_at: String,
    updated_at: String,
}

impl From<&StoredMcpServer> for McpServerOut {
    fn from(s: &StoredMcpServer) -> Self {
        McpServerOut {
            name: s.name.clone(),
            url: fleet_protocol::sanitize::url_without_credentials(&s.url),
            header_names: s.header_names.clone(),
            tool_names: s.tool_names.clone(),
            max_discovery_pages: s.max_discovery_pages,
            max_capabilities: s.max_capabilities,
            max_concurrency: s.limits.max_concurrency,
            rate_limit: s.limits.rate_limit,
            retry: s.retry.clone(),
            circuit_breaker: s.circuit_breaker,
            retry_unknown: s.retry_unknown,
            requires_approval_for_destructive: s.requires_approval_for_destructive,
            tools: s.tools.clone(),
            discovered_at: rfc3339_from_millis(s.discovered_at_ms),
            last_error: s.last_error.clone(),
            created_at: rfc3339_from_millis(s.created_at_ms),
            updated_at: rfc3339_from_millis(s.updated_at_ms),
        }
    }
}

/// A refused discovery as the API answers it: 422 naming the cause (409 for a name taken).
fn refused(e: Refused) -> ApiError {
    let code = match &e {
        Refused::Unreachable(_) => "mcp_unreachable",
        Refused::NotMcp(_) => "mcp_not_a_server",
        Refused::Unauthorized(_) => "mcp_unauthorized",
        Refused::Invalid(_) => "mcp_invalid_tools",
        Refused::Budget(_) => "mcp_budget_exceeded",
        Refused::Conflict(_) => return ApiError::new(StatusCode::CONFLICT, "tool_exists", e.to_string()),
        Refused::Store(_) => {
            return ApiError::from(match e {
                Refused::Store(s) => s,
                _ => unreachable!("matched above"),
            })
        }
    };
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, e.to_string())
}

fn budget(field: &str, value: Option<u32>, default: u32, max: u32) -> Result<u32, ApiError> {
    match value {
        None => Ok(default),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(_) => Err(ApiError::invalid(format!("{field} must be 1-{max}"))),
    }
}

/// The checks a registration passes before anything is sent (pure).
fn check(input: &McpServerInput, allow_private: bool) -> Result<(), ApiError> {
    let n = &input.name;
    if n.is_empty() || n.len() > 32 || !is_plain_tool_name(n) {
        return Err(ApiError::invalid("name must be 1-32 letters, digits, '_' or '-'"));
    }
    validate::callback_url("url", &input.url, allow_private)?;
    let headers = input.headers.iter().flatten();
    if input.headers.as_ref().is_some_and(|h| h.len() > MAX_HEADERS) {
        return Err(ApiError::invalid(format!("headers holds more than {MAX_HEADERS}")));
    }
    for (name, value) in headers {
        let reserved = ["host", "content-type", "content-length", "accept", "mcp-session-id", "mcp-protocol-version"];
        if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err()
            || reserved.contains(&name.to_ascii_lowercase().as_str())
        {
            return Err(ApiError::invalid(format!("headers: {name:?} is not a header a registration may set")));
        }
        if axum::http::HeaderValue::from_str(value).is_err() || value.len() > 8192 {
            return Err(ApiError::invalid(format!("headers: the value of {name:?} is not a valid header value")));
        }
    }
    for (tool, fleet) in input.tool_names.iter().flatten() {
        if !is_plain_tool_name(fleet) || is_tool_id(fleet) {
            return Err(ApiError::invalid(format!(
                "tool_names: {tool:?} maps to {fleet:?}, which is not a tool name (1-64 letters, digits, '_' or '-')"
            )));
        }
    }
    if let Some(spec) = &input.retry {
        spec.check().map_err(|e| ApiError::invalid(e.to_string()))?;
    }
    if let Some(problem) = input.circuit_breaker.as_ref().and_then(CircuitBreaker::problem) {
        return Err(ApiError::invalid(problem));
    }
    Ok(())
}

/// The record `input` makes (its headers encrypted, nothing discovered yet).
fn stored(state: &AppState, input: McpServerInput, now: i64) -> Result<StoredMcpServer, ApiError> {
    let limits = limits::merge(&ToolLimits::default(), input.max_concurrency.as_ref(), input.rate_limit.as_ref())
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let headers = input.headers.unwrap_or_default();
    let headers_ciphertext = if headers.is_empty() {
        String::new()
    } else {
        let text = serde_json::to_string(&headers).expect("headers serialise");
        state.config.secrets_key.encrypt(&StoredMcpServer::headers_owner(&input.name), &text)
    };
    Ok(StoredMcpServer {
        header_names: headers.keys().cloned().collect(),
        headers_ciphertext,
        tool_names: input.tool_names.unwrap_or_default(),
        max_discovery_pages: budget("max_discovery_pages", input.max_discovery_pages, DEFAULT_MAX_PAGES, 1000)?,
        max_capabilities: budget("max_capabilities", input.max_capabilities, DEFAULT_MAX_CAPABILITIES, 10_000)?,
        limits,
        retry: input.retry,
        circuit_breaker: input.circuit_breaker,
        retry_unknown: input.retry_unknown.unwrap_or(false),
        requires_approval_for_destructive: input.requires_approval_for_destructive.unwrap_or(false),
        tools: vec![],
        discovered_at_ms: 0,
        last_error: None,
        created_at_ms: now,
        updated_at_ms: now,
        name: input.name,
        url: input.url,
    })
}

fn discoverer(state: &AppState) -> Discoverer<'_> {
    Discoverer { store: &state.store, secrets: &state.config.secrets_key, clients: &state.mcp }
}

/// Discovers `server`'s tools and saves it; the tools' cached schemas are forgotten.
async fn discover_and_save(state: &AppState, server: &mut StoredMcpServer) -> Result<(), ApiError> {
    let changed = discoverer(state).discover(server).await.map_err(refused)?;
    server.updated_at_ms = now_ms();
    state.store.registry().put_mcp_server(server).await?;
    for name in changed {
        state.tool_schemas.forget(&name);
    }
    Ok(())
}

/// `POST /v1/mcp_servers`: registers a server and discovers its tools at once; 201, or 422 naming
/// why its tools cannot be used (nothing is stored then).
#[utoipa::path(post, path = "/v1/mcp_servers", extensions(("x-tenancy" = json!("operator"))), tag = "mcp", security(("bearer" = ["tools:write", "operator"])),
    request_body(content = McpServerInput, description = "The server (name and url required)"),
    responses((status = 201, description = "Registered, its tools discovered", body = Data<McpServerOut>),
        (status = 409, description = "A server of that name exists (`mcp_server_exists`) or a tool name is taken (`tool_exists`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn post_mcp_server(
    State(state): State<AppState>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<(StatusCode, Json<Data<McpServerOut>>), ApiError> {
    require_json(&headers)?;
    let input: McpServerInput = validate::parse_body(&body)?;
    check(&input, state.config.allow_private_callbacks)?;
    if !state.config.allow_private_callbacks {
        refuse_private_resolution(&input.url).await?;
    }
    if state.store.registry().get_mcp_server(&input.name).await?.is_some() {
        let why = format!("an MCP server named {:?} is registered; DELETE it first to register it again", input.name);
        return Err(ApiError::new(StatusCode::CONFLICT, "mcp_server_exists", why));
    }
    let mut server = stored(&state, input, now_ms())?;
    discover_and_save(&state, &mut server).await?;
    Ok((StatusCode::CREATED, Data::json(McpServerOut::from(&server))))
}

fn no_server(name: &str) -> ApiError {
    ApiError::not_found(format!("no MCP server named {name:?}"))
}

#[utoipa::path(post, path = "/v1/mcp_servers/{name}/discover", extensions(("x-tenancy" = json!("operator"))), tag = "mcp", security(("bearer" = ["tools:write", "operator"])),
    params(("name" = String, Path, description = "The server's name")),
    responses((status = 200, description = "Discovered again: its tools are what it lists now", body = Data<McpServerOut>),
        (status = 404, description = "No such server", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn discover_mcp_server(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Data<McpServerOut>>, ApiError> {
    let mut server = state.store.registry().get_mcp_server(&name).await?.ok_or_else(|| no_server(&name))?;
    discover_and_save(&state, &mut server).await?;
    Ok(Data::json(McpServerOut::from(&server)))
}

#[utoipa::path(get, path = "/v1/mcp_servers/{name}", extensions(("x-tenancy" = json!("operator"))), tag = "mcp", security(("bearer" = ["tools:read", "operator"])),
    params(("name" = String, Path, description = "The server's name")),
    responses((status = 200, description = "The server", body = Data<McpServerOut>),
        (status = 404, description = "No such server", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn get_mcp_server(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Data<McpServerOut>>, ApiError> {
    let server = state.store.registry().get_mcp_server(&name).await?.ok_or_else(|| no_server(&name))?;
    Ok(Data::json(McpServerOut::from(&server)))
}

#[utoipa::path(get, path = "/v1/mcp_servers", extensions(("x-tenancy" = json!("operator"))), tag = "mcp", security(("bearer" = ["tools:read", "operator"])), params(crate::routes::common::Page),
    responses((status = 200, description = "MCP servers by name", body = Listed<McpServerOut>), crate::routes::docs::CommonErrors))]
pub(crate) async fn list_mcp_servers(
    State(state): State<AppState>,
    ApiQuery(page): ApiQuery<Page>,
) -> Result<Json<Listed<McpServerOut>>, ApiError> {
    let limit = page_limit(page.limit)?;
    let servers = state.store.registry().list_mcp_servers(page.cursor.as_deref(), limit + 1).await?;
    let next = (servers.len() > limit).then(|| servers[limit - 1].name.clone());
    Ok(Listed::json(servers.iter().take(limit).map(McpServerOut::from).collect(), next))
}

/// `DELETE /v1/mcp_servers/{name}`: the server and the tools it stored.
#[utoipa::path(delete, path = "/v1/mcp_servers/{name}", extensions(("x-tenancy" = json!("operator"))), tag = "mcp", security(("bearer" = ["tools:write", "operator"])),
    params(("name" = String, Path, description = "The server's name")),
    responses((status = 204, description = "Deleted, with its tools"),
        (status = 404, description = "No such server", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn delete_mcp_server(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let server = state.store.registry().get_mcp_server(&name).await?.ok_or_else(|| no_server(&name))?;
    for tool in &server.tools {
        let owned = state.store.registry().get_tool(tool).await?;
        if owned.is_some_and(|t| t.execution.mcp().is_some_and(|m| m.server == name)) {
            state.store.registry().delete_tool(tool, None).await?;
            state.tool_schemas.forget(tool);
        }
    }
    state.store.registry().delete_mcp_server(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// This module's routes, each with its OpenAPI operation.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(list_mcp_servers, post_mcp_server))
        .routes(utoipa_axum::routes!(get_mcp_server, delete_mcp_server))
        .routes(utoipa_axum::routes!(discover_mcp_server))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn input(body: Value) -> McpServerInput {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn registrations_are_checked_before_anything_is_sent() {
        let ok = json!({"name": "files", "url": "http://m.example/mcp", "headers": {"Authorization": "Bearer x"}});
        assert!(check(&input(ok), true).is_ok());
        for (body, says) in [
            (json!({"name": "a.b", "url": "http://m.example"}), "name"),
            (json!({"name": "a", "url": "ftp://m.example"}), "url"),
            (json!({"name": "a", "url": "http://m.example", "headers": {"Host": "x"}}), "headers"),
            (json!({"name": "a", "url": "http://m.example", "tool_names": {"t": "a.t"}}), "tool_names"),
        ] {
            let e = check(&input(body), true).unwrap_err();
            assert!(e.message.contains(says), "{says}: {}", e.message);
        }
        assert!(budget("max_capabilities", Some(0), 1, 10).is_err());
        assert_eq!(budget("max_capabilities", None, 7, 10).unwrap(), 7);
    }
}
