//! The OpenAPI document's shared parts: its description and tags, the error responses every route
//! can give, and the bearer scheme with its scopes. The paths come from each handler's
//! `#[utoipa::path]`, joined with the router itself (`routes::documented`), so no route can be
//! served without being documented; the bodies' schemas are derived on the types the handlers
//! read and answer with (`routes::wire` wraps the answers), so none can drift from its route.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoResponses, Modify, OpenApi};

/// The document's fixed parts; `routes::openapi` adds the paths.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "fleet dispatcher",
        description = "The fleet's HTTP API: tool registry, tool calls and agent turns as durable jobs, \
                       sessions, executions, dead letters, webhooks. Every route but this document needs \
                       `Authorization: Bearer <token>`; a token may be limited to scopes (see each \
                       operation's security requirement).",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    modifiers(&BearerAuth),
    // Schemas only a query parameter names (a body's schemas are collected from the paths).
    components(schemas(fleet_protocol::history::Order, fleet_protocol::agents::RoomStatus)),
    tags(
        (name = "tools", description = "The tool registry"),
        (name = "tool-calls", description = "Tool calls as durable jobs"),
        (name = "turns", description = "Agent turns"),
        (name = "sessions", description = "A session's conversation and event stream"),
        (name = "agent-sessions", description = "Seed 001: a session's input, client tool outputs and compaction as events"),
        (name = "executions", description = "What became of a job"),
        (name = "dead-letters", description = "Jobs that failed for good"),
        (name = "webhooks", description = "Event subscriptions"),
        (name = "assistants", description = "Seed 000's assistants: what a room's turns run with"),
        (name = "rooms", description = "Seed 000's rooms (a room is a session) and their messages"),
        (name = "approvals", description = "Calls waiting for an operator's decision"),
        (name = "audit", description = "What operators changed"),
        (name = "usage", description = "Model tokens used per hour, by tenant and assistant"),
        (name = "data-sources", description = "Seed 000's data sources: databases and REST APIs an assistant queries, read-only, as jobs"),
        (name = "knowledge-base", description = "Seed 000's knowledge base: the services an assistant can connect to"),
        (name = "meta", description = "This document"),
    )
)]
pub(crate) struct ApiDoc;

/// The name of the bearer scheme the operations' security requirements refer to.
pub(crate) const BEARER: &str = "bearer";

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "A token from FLEET_API_TOKENS. A plain token has every scope; `TOKEN:SCOPE+SCOPE` has only \
                 those; `TOKEN@TENANT` is bound to a tenant. The scope an operation needs is listed in its \
                 security requirement; a token \
                 without it gets 403 `insufficient_scope`. A requirement that also lists the role `operator` \
                 is the operators': a token bound to a tenant gets 403 `operator_only` whatever its scopes.",
            ))
            .build();
        components.add_security_scheme(BEARER, SecurityScheme::Http(scheme));
    }
}

pub(crate) use crate::error::ErrorBody;

/// The errors every authenticated route can answer with.
// Never built: an enum of responses is how utoipa documents a set of them.
#[derive(IntoResponses)]
#[allow(dead_code)]
pub(crate) enum CommonErrors {
    /// The request is not well-formed (bad JSON, wrong Content-Type, bad header).
    #[response(status = 400)]
    Malformed(ErrorBody),
    /// No valid bearer token.
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// The token lacks the operation's scope (`insufficient_scope`, naming it), or a tenant-bound
    /// token asked for the operator's configuration or log (`operator_only`).
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// The body exceeds the size limit.
    #[response(status = 413)]
    TooLarge(ErrorBody),
    /// A field is invalid (the message names it).
    #[response(status = 422)]
    Invalid(ErrorBody),
    /// Redis or the broker is unavailable; nothing was accepted (or, for `outcome_unknown`, the
    /// job may run: retry with the same `Idempotency-Key`).
    #[response(status = 503)]
    Unavailable(ErrorBody),
    /// A stored record could not be read.
    #[response(status = 500)]
    Internal(ErrorBody),
}
