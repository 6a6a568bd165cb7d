//! Seed 000's assistants: `POST|GET /v1/agents/assistants`, `GET|PUT|DELETE
//! /v1/agents/assistants/{assistant_id}`, with the seed's fields, validation and defaults. An
//! assistant's turns run with a copy of it taken when each message is sent (`rooms.rs`), so an
//! update changes the turns of messages sent after it, never one already sent.

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use fleet_platform::now_ms;
use fleet_platform::store::{AssistantVersion, AssistantWrite};
use fleet_protocol::agent_config::secret_owner;
use fleet_protocol::agents::{self, AssistantInput, AssistantOut, AssistantRecord, ListRequest, ModelDefaults};

use crate::error::ApiError;
use crate::routes::common::{ApiQuery, JsonInput, Tenancy};
use crate::wire::Data;
use crate::AppState;

/// Conditional writes tried before a request gives up on an assistant that keeps changing under it.
const WRITE_ATTEMPTS: usize = 5;

fn busy() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "assistant_busy",
        "the assistant kept changing while this request wrote it; try again",
    )
}

fn no_assistant(id: &str) -> ApiError {
    ApiError::not_found(format!("no assistant with id {:?}", id.chars().take(80).collect::<String>()))
}

fn name_taken(name: &str, holder: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "assistant_exists",
        format!(
            "an assistant named {name:?} already exists (id {holder}); PUT /v1/agents/assistants/{holder} updates it"
        ),
    )
}

/// The checks that need the fleet: the provider is a configured one, every enabled tool is
/// registered.
async fn check_with_fleet(state: &AppState, assistant: &AssistantRecord) -> Result<(), ApiError> {
    let known = state.config.common.llm.names();
    if let Some(p) = assistant.model_config.provider.as_deref().filter(|p| !known.contains(p)) {
        return Err(ApiError::invalid(format!(
            "model_config.provider {p:?} is not a configured provider (configured: {})",
            known.join(", ")
        )));
    }
    crate::routes::tools::require_registered(state, "enabled_tools", &assistant.enabled_tools).await?;
    crate::routes::webhooks::require_output_sink(state, assistant.agent.output_sink.as_deref()).await?;
    let configured: Vec<String> = assistant.agent.tool_configurations.values().map(|c| c.tool_name.clone()).collect();
    crate::routes::tools::require_registered(state, "tool_configurations' tool_name", &configured).await
}

/// Seals an agent secret's value with `FLEET_SECRETS_KEY`, for its agent and name only.
fn sealer(state: &AppState) -> impl Fn(&str, &str, &str) -> String + '_ {
    move |agent, name, value| state.config.secrets_key.encrypt(&secret_owner(agent, name), value)
}

/// The assistant `id` names, as stored, if the caller sees it (an id of the wrong shape names
/// none; another tenant's is as if there were none).
pub(crate) async fn find(state: &AppState, tenancy: &Tenancy, id: &str) -> Result<Option<AssistantVersion>, ApiError> {
    if !agents::is_id("asst_", id) {
        return Ok(None);
    }
    let found = state.store.registry().read_assistant(id).await?;
    Ok(found.filter(|v| v.record.seen_by(tenancy.bound.as_deref())))
}

/// The assistant `id` names, for a change: the caller's tenant's, or (unbound) any; an
/// operator's assistant, which every tenant's turns may use, is refused to a tenant-bound token.
async fn find_to_change(state: &AppState, tenancy: &Tenancy, id: &str) -> Result<AssistantVersion, ApiError> {
    let found = find(state, tenancy, id).await?.ok_or_else(|| no_assistant(id))?;
    if tenancy.bound.is_some() && found.record.tenant.is_none() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "operator_only",
            format!(
                "assistant {id} is the operator's (shared by every tenant): a tenant-bound token may not change it"
            ),
        ));
    }
    Ok(found)
}

/// Creates an assistant (the seed's Step 1): `name`, `title` and `instructions` required;
/// `model_config` defaults to the fleet's provider and model and the seed's temperature 0.7.
#[utoipa::path(post, path = "/v1/agents/assistants", extensions(("x-tenancy" = json!("own"))), tag = "assistants", security(("bearer" = ["assistants:write"])),
    request_body(content = AssistantInput, description = "The assistant (name, title and instructions required)"),
    responses((status = 201, description = "Created", body = Data<AssistantOut>),
        (status = 409, description = "An assistant of that name exists (`assistant_exists`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn create_assistant(
    State(state): State<AppState>,
    tenancy: Tenancy,
    JsonInput { value: input, .. }: JsonInput<AssistantInput>,
) -> Result<(StatusCode, Json<Data<AssistantOut>>), ApiError> {
    let routing = &state.config.common.llm;
    let defaults = ModelDefaults { provider: &routing.default_provider, model: &routing.default_model };
    let mut assistant =
        input.create(agents::new_assistant_id(), &defaults, now_ms(), &sealer(&state)).map_err(ApiError::invalid)?;
    // A tenant-bound token's assistant is its tenant's; an unbound token's is shared by all.
    assistant.tenant = tenancy.bound;
    check_with_fleet(&state, &assistant).await?;
    match state.store.registry().write_assistant(&assistant, None).await? {
        AssistantWrite::Written => Ok((StatusCode::CREATED, Data::json(assistant.to_api()))),
        AssistantWrite::NameTaken(holder) => Err(name_taken(&assistant.name, &holder)),
        AssistantWrite::Changed => Err(busy()),
    }
}

/// Assistants, newest first, with the seed's listing shape (`data.assistants`).
#[utoipa::path(get, path = "/v1/agents/assistants", extensions(("x-tenancy" = json!("listing"))), tag = "assistants", security(("bearer" = ["assistants:read"])),
    params(("limit" = Option<u32>, Query, description = "1-100 (default 50)", minimum = 1, maximum = 100),
        ("cursor" = Option<String>, Query, description = "`next_cursor` from the previous page")),
    responses((status = 200, description = "Assistants, newest first", body = Data<AssistantPage>),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn list_assistants(
    State(state): State<AppState>,
    tenancy: Tenancy,
    ApiQuery(q): ApiQuery<HashMap<String, String>>,
) -> Result<Json<Data<AssistantPage>>, ApiError> {
    let req = ListRequest::parse(q.get("limit").map(String::as_str), q.get("cursor").map(String::as_str))
        .map_err(ApiError::invalid)?;
    let page = state.store.registry().list_assistants(req.after.as_deref(), req.limit).await?;
    // A tenant-bound token's page holds its tenant's and the operators' (it may so come back short).
    let bound = tenancy.bound;
    let seen = page.entries.iter().filter(|a| a.seen_by(bound.as_deref()));
    Ok(Data::json(AssistantPage {
        assistants: seen.map(AssistantRecord::to_api).collect(),
        has_more: page.next.is_some(),
        next_cursor: page.next.as_deref().map(agents::encode_cursor),
    }))
}

/// A page of assistants, the seed's listing shape.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AssistantPage {
    /// Newest first.
    assistants: Vec<AssistantOut>,
    has_more: bool,
    /// Pass as `cursor` for the next page; null at the end.
    next_cursor: Option<String>,
}

/// What deleting an assistant did.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AssistantDeleted {
    id: String,
    deleted: bool,
    /// Its rooms that were active and are now closed.
    rooms_closed: u64,
}

#[utoipa::path(get, path = "/v1/agents/assistants/{assistant_id}", extensions(("x-tenancy" = json!("resource"))), tag = "assistants", security(("bearer" = ["assistants:read"])),
    params(("assistant_id" = String, Path, description = "The assistant's id (`asst_…`)")),
    responses((status = 200, description = "The assistant", body = Data<AssistantOut>),
        (status = 404, description = "No such assistant", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn get_assistant(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path(id): Path<String>,
) -> Result<Json<Data<AssistantOut>>, ApiError> {
    let version = find(&state, &tenancy, &id).await?.ok_or_else(|| no_assistant(&id))?;
    Ok(Data::json(version.record.to_api()))
}

/// Updates the fields given (the seed's example: `instructions` and `model_config.temperature`);
/// `model_config`'s fields merge one by one. Messages sent before the update keep the version
/// they were sent with.
#[utoipa::path(put, path = "/v1/agents/assistants/{assistant_id}", extensions(("x-tenancy" = json!("resource"))), tag = "assistants", security(("bearer" = ["assistants:write"])),
    params(("assistant_id" = String, Path, description = "The assistant's id (`asst_…`)")),
    request_body(content = AssistantInput, description = "The fields to change"),
    responses((status = 200, description = "Updated (its `version` grew by one)", body = Data<AssistantOut>),
        (status = 404, description = "No such assistant", body = crate::routes::docs::ErrorBody),
        (status = 409, description = "Another assistant has the name (`assistant_exists`), or it kept changing (`assistant_busy`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn update_assistant(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path(id): Path<String>,
    JsonInput { value: input, .. }: JsonInput<AssistantInput>,
) -> Result<Json<Data<AssistantOut>>, ApiError> {
    for _ in 0..WRITE_ATTEMPTS {
        let current = find_to_change(&state, &tenancy, &id).await?;
        let next = input.clone().apply(&current.record, now_ms(), &sealer(&state)).map_err(ApiError::invalid)?;
        check_with_fleet(&state, &next).await?;
        match state.store.registry().write_assistant(&next, Some(&current)).await? {
            AssistantWrite::Written => return Ok(Data::json(next.to_api())),
            AssistantWrite::NameTaken(holder) => return Err(name_taken(&next.name, &holder)),
            AssistantWrite::Changed => continue,
        }
    }
    Err(busy())
}

/// Deletes the assistant and closes its active rooms (their history stays readable). Turns
/// already sent run to their end with the copy they were sent with.
#[utoipa::path(delete, path = "/v1/agents/assistants/{assistant_id}", extensions(("x-tenancy" = json!("resource"))), tag = "assistants", security(("bearer" = ["assistants:write"])),
    params(("assistant_id" = String, Path, description = "The assistant's id (`asst_…`)")),
    responses((status = 200, description = "Deleted; `rooms_closed` of its rooms were closed", body = Data<AssistantDeleted>),
        (status = 404, description = "No such assistant", body = crate::routes::docs::ErrorBody),
        (status = 409, description = "It kept changing (`assistant_busy`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn delete_assistant(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path(id): Path<String>,
) -> Result<Json<Data<AssistantDeleted>>, ApiError> {
    let mut deleted = false;
    for _ in 0..WRITE_ATTEMPTS {
        let current = find_to_change(&state, &tenancy, &id).await?;
        if state.store.registry().delete_assistant(&current).await? {
            deleted = true;
            break;
        }
    }
    if !deleted {
        return Err(busy());
    }
    let rooms_closed = crate::routes::closing::close_rooms_of(&state, &id).await;
    Ok(Data::json(AssistantDeleted { id, deleted: true, rooms_closed }))
}

/// This module's routes, each with its OpenAPI operation (path, method, scope): adding a route
/// here is all it takes to serve, document and guard it.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(create_assistant, list_assistants))
        .routes(utoipa_axum::routes!(get_assistant, update_assistant, delete_assistant))
}
