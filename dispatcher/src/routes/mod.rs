//! The HTTP API's routes, one module per resource, and the router that joins them (with the
//! bearer-token check and request metrics around every route).

pub(crate) mod agent_events;
pub(crate) mod approvals;
pub(crate) mod artifacts;
pub(crate) mod assistants;
pub(crate) mod audit;
pub(crate) mod closing;
pub(crate) mod common;
pub(crate) mod data_sources;
pub(crate) mod dead_letters;
pub(crate) mod docs;
pub(crate) mod executions;
pub(crate) mod knowledge_base;
pub(crate) mod mcp_servers;
pub(crate) mod rooms;
pub(crate) mod sessions;
pub(crate) mod stream;
pub(crate) mod submit;
pub(crate) mod submit_batch;
pub(crate) mod tool_calls;
pub(crate) mod tools;
pub(crate) mod turns;
pub(crate) mod usage;
pub(crate) mod webhooks;
pub(crate) use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ApiError;
use crate::AppState;

/// Every authenticated route with its OpenAPI operation: a route is served only as documented.
fn documented() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(docs::ApiDoc::openapi())
        .merge(tools::routes())
        .merge(mcp_servers::routes())
        .merge(data_sources::routes())
        .merge(audit::routes())
        .merge(approvals::routes())
        .merge(usage::routes())
        .merge(tool_calls::routes())
        .merge(turns::routes())
        .merge(stream::routes())
        .merge(sessions::routes())
        .merge(webhooks::routes())
        .merge(executions::routes())
        .merge(dead_letters::routes())
        .merge(assistants::routes())
        .merge(rooms::routes())
        .merge(agent_events::routes())
        .merge(artifacts::routes())
        .merge(knowledge_base::routes())
}

/// The routes that need no token, documented the same way.
fn documented_public() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(openapi_json))
}

/// The API's OpenAPI 3.1 document, as served at `GET /v1/openapi.json` and checked in as
/// `docs/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut api = documented().into_openapi();
    api.merge(documented_public().into_openapi());
    // utoipa makes a body optional only by making it nullable; these take no body (match all, or
    // a room with no namespace or metadata) but refuse `null`.
    for path in ["/v1/dead-letters/retry", "/v1/dead-letters/purge", "/v1/agents/{assistant_id}/rooms"] {
        let body = api.paths.paths.get_mut(path).and_then(|item| item.post.as_mut()?.request_body.as_mut());
        if let Some(body) = body {
            body.required = Some(utoipa::openapi::Required::False);
        }
    }
    api
}

/// Every authenticated route's scope and whether it is the operators', read once from the
/// handlers' OpenAPI declarations (`scopes::RouteRules`).
pub(crate) fn route_rules() -> &'static crate::scopes::RouteRules {
    static RULES: std::sync::OnceLock<crate::scopes::RouteRules> = std::sync::OnceLock::new();
    RULES.get_or_init(|| {
        let doc = serde_json::to_value(openapi()).expect("the OpenAPI document serialises");
        crate::scopes::RouteRules::from_openapi(&doc, docs::BEARER).expect("every operation declares one scope")
    })
}

/// The document as served and checked in: pretty JSON with a final newline.
pub fn openapi_text() -> String {
    let mut text = openapi().to_pretty_json().expect("the OpenAPI document serialises");
    text.push('\n');
    text
}

/// The API's contract (no token needed).
#[utoipa::path(get, path = "/v1/openapi.json", extensions(("x-tenancy" = json!("own"))), tag = "meta", security(()),
    responses((status = 200, description = "This document (OpenAPI 3.1)", content_type = "application/json", body = Object)))]
async fn openapi_json() -> Response {
    static DOC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let text = DOC.get_or_init(openapi_text).clone();
    ([(axum::http::header::CONTENT_TYPE, "application/json")], text).into_response()
}

/// The API's router, with `pages` (the console, which sits above the routes and is handed in
/// here) behind the same body limit and metrics.
pub fn router(state: AppState, pages: Router) -> Router {
    // Read now, so a route declared wrongly stops the dispatcher at its start, not at a request.
    route_rules();
    let (authenticated, _) = documented().split_for_parts();
    let (public, _) = documented_public().split_for_parts();
    let v1 = authenticated
        .route_layer(middleware::from_fn_with_state(state.clone(), common::require_token))
        // Merged after the token check, so they need none.
        .merge(public)
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(middleware::from_fn(json_errors))
        .with_state(state.clone());
    let ready_state = state.clone();
    let readiness: fleet_platform::ops::ReadinessCheck = Arc::new(move || {
        let s = ready_state.clone();
        Box::pin(async move {
            if s.broker.current().is_none() {
                return Err("broker not connected".to_string());
            }
            s.store.redis().ping().await.map_err(|e| e.to_string())
        })
    });
    v1.merge(pages)
        .merge(fleet_platform::ops::router(state.metrics.clone(), readiness, None))
        .layer(axum::extract::DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(middleware::from_fn_with_state(state, record_metrics))
}

/// Answers every error in the API's JSON shape, the framework's own included (a 405 for a method
/// the route does not serve, a path segment that does not decode), which come as plain text or
/// with no body at all. Its headers (`Allow`, `WWW-Authenticate`) are kept. Every answer says
/// `X-Content-Type-Options: nosniff`: what a request echoes (a path in a message) is only ever
/// read as JSON, never as a page.
async fn json_errors(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path: String = request.uri().path().chars().take(200).collect();
    let mut response = next.run(request).await;
    response
        .headers_mut()
        .insert(axum::http::header::X_CONTENT_TYPE_OPTIONS, axum::http::HeaderValue::from_static("nosniff"));
    let status = response.status();
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = match axum::body::to_bytes(body, 4096).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
        Err(_) => String::new(),
    };
    let (code, generic) = framework_error(status);
    let message = match (status, text.is_empty()) {
        // The router adds `Allow` after this layer has run, when it has it at all.
        (axum::http::StatusCode::METHOD_NOT_ALLOWED, _) => match parts.headers.get(axum::http::header::ALLOW) {
            Some(allowed) => format!("{method} is not allowed on {path} (allowed: {})", allowed.to_str().unwrap_or("")),
            None => format!("{method} is not allowed on {path}; the Allow header lists the methods that are"),
        },
        (_, true) => generic.to_string(),
        (_, false) => text,
    };
    let mut answer = ApiError::new(status, code, message).into_response();
    for name in [
        axum::http::header::ALLOW,
        axum::http::header::WWW_AUTHENTICATE,
        axum::http::header::RETRY_AFTER,
        axum::http::header::X_CONTENT_TYPE_OPTIONS,
    ] {
        if let Some(value) = parts.headers.get(&name) {
            answer.headers_mut().insert(name, value.clone());
        }
    }
    answer
}

/// The code and a generic message of an error the framework answered by itself.
fn framework_error(status: axum::http::StatusCode) -> (&'static str, &'static str) {
    match status.as_u16() {
        400 => ("malformed_request", "the request is not well-formed"),
        401 => ("unauthorized", "a valid 'Authorization: Bearer <token>' header is required"),
        403 => ("forbidden", "this request is not allowed"),
        404 => ("not_found", "no such route"),
        405 => ("method_not_allowed", "this method is not allowed on this route"),
        413 => ("body_too_large", "request body exceeds the size limit"),
        415 => ("unsupported_media_type", "Content-Type must be application/json"),
        422 => ("invalid_request", "the request is invalid"),
        429 => ("rate_limited", "too many requests"),
        503 => ("unavailable", "the service is unavailable; try again"),
        500..=599 => ("internal", "the request failed"),
        _ => ("error", "the request failed"),
    }
}

async fn record_metrics(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route =
        request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_else(|| "unmatched".into());
    let method = request.method().as_str().to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    let class = fleet_protocol::classify::status_class(response.status().as_u16());
    state.metrics.http_requests.with_label_values(&[&route, &method, class]).inc();
    state.metrics.http_request_duration.with_label_values(&[&route]).observe(started.elapsed().as_secs_f64());
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;

    #[test]
    fn the_checked_in_openapi_document_is_the_generated_one() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            checked_in == openapi_text(),
            "docs/openapi.json is not the document the code generates; regenerate it with\n  \
             cargo run -q -p fleet-dispatcher --bin dispatcher -- --print-openapi > docs/openapi.json"
        );
    }

    /// Every operation but the document itself declares one scope (a route without one would be
    /// open to full-rights tokens only), and the operators' routes are the shared configuration
    /// and the audit log.
    #[test]
    fn every_authenticated_operation_declares_its_scope_and_the_operators_are_the_configurations() {
        let doc = serde_json::to_value(openapi()).unwrap();
        let operations: usize = doc["paths"].as_object().unwrap().values().map(|i| i.as_object().unwrap().len()).sum();
        assert_eq!(route_rules().len(), operations - 1, "every operation but GET /v1/openapi.json has a rule");
        assert_eq!(route_rules().get(&Method::GET, "/v1/openapi.json"), None);
        let expected = [
            "DELETE /v1/data-sources/{id}",
            "DELETE /v1/mcp_servers/{name}",
            "DELETE /v1/tools/{tool}",
            "DELETE /v1/webhooks/{id}",
            "GET /v1/audit",
            "GET /v1/data-sources",
            "GET /v1/data-sources/{id}",
            "GET /v1/mcp_servers",
            "GET /v1/mcp_servers/{name}",
            "GET /v1/webhooks",
            "GET /v1/webhooks/{id}",
            "PATCH /v1/data-sources/{id}/semantic-mappings",
            "POST /v1/data-sources",
            "POST /v1/data-sources/{id}/query",
            "POST /v1/data-sources/{id}/refresh-schema",
            "POST /v1/mcp_servers",
            "POST /v1/mcp_servers/{name}/discover",
            "POST /v1/tools",
            "POST /v1/tools/{tool}/circuit/close",
            "PUT /v1/data-sources/{id}",
            "PUT /v1/tools/{tool}",
            "PUT /v1/webhooks/{id}",
        ];
        assert_eq!(route_rules().operator_only(), expected);
    }
}
