//! The tool registry's routes: the seed's `POST /v1/tools` (create only) and the SPEC's
//! `PUT /v1/tools/{name}` (create or update), with `/v1/tools/{tool}` taking the id the registry
//! hands out as well as the name.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use fleet_platform::now_ms;
use fleet_platform::store::{StoredTool, ToolVersion};
use fleet_protocol::approvals::{ApprovalSettings, Effect, TimeoutOutcome, DEFAULT_APPROVAL_TIMEOUT_SECS};
use fleet_protocol::circuit::CircuitBreaker;
use fleet_protocol::limits::{self, RateLimit, ToolLimits};
use fleet_protocol::retry_spec::{self, ObjectOnly, RetrySpec};
use fleet_protocol::schema::ToolSchema;
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::tools::{is_tool_id, new_tool_id, ToolExecution, ToolRef};

use crate::circuit::ToolHealthOut;
use crate::error::ApiError;
use crate::routes::common::{page_limit, refuse_private_resolution, require_json, ApiQuery, Body, Page, Tenancy};
use crate::validate;
use crate::wire::{Data, Listed};
use crate::AppState;

/// Conditional writes tried before a request gives up on a tool that keeps changing under it.
const WRITE_ATTEMPTS: usize = 5;

/// A tool registration or update. On create, `callback_url` and `callback_secret` are required
/// (and `name` for `POST /v1/tools`); on update, fields left out keep their value.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolInput {
    /// 1-64 letters, digits, `_` or `-`; must equal the path's name on `PUT`.
    name: Option<String>,
    /// At most 4096 characters.
    description: Option<String>,
    /// A JSON Schema (an object) the calls' parameters must satisfy.
    parameters: Option<Map<String, Value>>,
    /// An http(s) URL the worker POSTs signed calls to.
    callback_url: Option<String>,
    /// 16-1024 bytes; stored encrypted, never returned. Under `standard-webhooks`: `whsec_` and
    /// base64 of at least 24 bytes (the form the spec's libraries read).
    callback_secret: Option<String>,
    /// How callbacks are signed; `interactor` (the seed's) unless set.
    signature: Option<fleet_protocol::signature_scheme::SignatureScheme>,
    /// With a new `callback_secret`: keep the previous one for `FLEET_SECRET_ROTATION_GRACE`
    /// (under `standard-webhooks` both sign until then).
    rotate_secret: Option<bool>,
    /// The tool's retry schedule; `null` goes back to the fleet's default.
    #[serde(default, deserialize_with = "fleet_protocol::retry_spec::explicit_null")]
    #[schema(value_type = Option<RetrySpec>)]
    retry: Option<Option<RetrySpec>>,
    /// Callbacks in flight to this tool at once across the fleet (1-100000); `null` removes the limit.
    // Left out keeps it: `present` tells `null` from absent (`fleet_protocol::limits::merge`).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 100000, example = 2)]
    max_concurrency: Option<Value>,
    /// Callbacks per second across the fleet; `null` removes the limit.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<RateLimit>)]
    rate_limit: Option<Value>,
    /// The tool's circuit breaker (endpoint health); left out, the fleet's settings apply.
    #[serde(default, deserialize_with = "object_or_null")]
    circuit_breaker: Option<CircuitBreaker>,
    /// Who runs its calls: `callback` (the default; needs `callback_url` and `callback_secret`) or
    /// `client` (seed 001: the session's client answers with `tool_output`; no callback).
    execution: Option<ToolExecution>,
    /// A JSON Schema (an object) its results must satisfy: a client's `tool_output` that does not
    /// is refused (400 naming it). `null` removes it.
    #[serde(default, deserialize_with = "fleet_protocol::retry_spec::explicit_null")]
    #[schema(value_type = Option<Map<String, Value>>)]
    output_schema: Option<Option<Map<String, Value>>>,
    /// What its calls do: any of `read`, `write`, `execute`, `network` (an unknown one is a 400
    /// naming it).
    #[schema(value_type = Option<Vec<Effect>>)]
    effects: Option<Vec<String>>,
    /// Whether each call a model makes waits for an operator's decision (`/v1/approvals`).
    requires_approval: Option<bool>,
    /// How long a call waits for its decision: 1-2592000 seconds (default 3600).
    #[schema(minimum = 1, maximum = 2592000)]
    approval_timeout_secs: Option<u64>,
    /// What a call becomes when nobody decided in time (default `deny`).
    approval_timeout_outcome: Option<TimeoutOutcome>,
}

/// A tool as the API shows it (never its secret).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Tool)]
pub(crate) struct ToolOut {
    /// `tool_` and 32 hex digits.
    id: String,
    name: String,
    description: String,
    #[schema(value_type = Map<String, Value>)]
    parameters: Value,
    callback_url: String,
    signature: fleet_protocol::signature_scheme::SignatureScheme,
    /// RFC 3339: when the secret replaced by `rotate_secret` expires; null outside a rotation.
    previous_secret_expires_at: Option<String>,
    /// The tool's own retry schedule, or `null`: the fleet's default.
    retry: Option<RetrySpec>,
    /// Null: no limit.
    #[schema(minimum = 1, maximum = 100000)]
    max_concurrency: Option<u32>,
    /// Null: no limit.
    rate_limit: Option<RateLimit>,
    /// The tool's own circuit breaker; null: the fleet's settings.
    circuit_breaker: Option<CircuitBreaker>,
    /// Who runs its calls (`client`: its `callback_url` is empty).
    execution: ToolExecution,
    /// The JSON Schema its results must satisfy, if it has one.
    #[schema(value_type = Option<Map<String, Value>>)]
    output_schema: Option<Value>,
    /// What its calls do (seed 002's `effects`).
    effects: Vec<Effect>,
    /// Whether each call a model makes waits for an operator's decision (`/v1/approvals`).
    requires_approval: bool,
    /// How long a call waits for its decision.
    approval_timeout_secs: u64,
    /// What a call becomes when nobody decided in time.
    approval_timeout_outcome: TimeoutOutcome,
    /// Endpoint health, on `GET /v1/tools/{tool}` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    health: Option<ToolHealthOut>,
    /// RFC 3339.
    created_at: String,
    updated_at: String,
}

impl From<&StoredTool> for ToolOut {
    fn from(t: &StoredTool) -> Self {
        Self {
            id: t.id.clone(),
            name: t.name.clone(),
            description: t.description.clone(),
            parameters: t.parameters.clone(),
            callback_url: t.callback_url.clone(),
            signature: t.signing.scheme,
            previous_secret_expires_at: crate::signing::previous_secret_expires_at(&t.signing),
            retry: t.retry.clone(),
            max_concurrency: t.limits.max_concurrency,
            rate_limit: t.limits.rate_limit,
            circuit_breaker: t.circuit_breaker,
            execution: t.execution.clone(),
            output_schema: t.output_schema.clone(),
            effects: t.approvals.effects.clone(),
            requires_approval: t.approvals.requires_approval,
            approval_timeout_secs: t.approvals.approval_timeout_secs.unwrap_or(DEFAULT_APPROVAL_TIMEOUT_SECS),
            approval_timeout_outcome: t.approvals.approval_timeout_outcome.unwrap_or_default(),
            health: None,
            created_at: rfc3339_from_millis(t.created_at_ms),
            updated_at: rfc3339_from_millis(t.updated_at_ms),
        }
    }
}

impl ToolOut {
    /// The tool as `tenancy` may see it: a tenant-bound caller gets the callback URL without its
    /// user info or query string, where a tool owner's credential may be.
    fn shown_to(mut self, tenancy: &Tenancy) -> Self {
        if tenancy.bound.is_some() && !self.callback_url.is_empty() {
            self.callback_url = fleet_protocol::sanitize::url_without_credentials(&self.callback_url);
        }
        self
    }
}

/// What closing a tool's circuit found.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CircuitClosed {
    tool_name: String,
    /// Whether the circuit was open (or half-open) before.
    was_open: bool,
}

fn object_or_null<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<CircuitBreaker>, D::Error> {
    Option::<ObjectOnly<CircuitBreaker>>::deserialize(deserializer).map(|v| v.map(|o| o.0))
}

/// A field given, even as `null` (which `Option` alone would not tell from a field left out).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

/// The limits `input` makes of `current`'s; the error names the field.
fn limits(current: &ToolLimits, input: &ToolInput) -> Result<ToolLimits, ApiError> {
    limits::merge(current, input.max_concurrency.as_ref(), input.rate_limit.as_ref())
        .map_err(|e| ApiError::invalid(e.to_string()))
}

/// The checks each given field passes on its own (the schema is compiled to see that it is one).
fn check_fields(input: &ToolInput, allow_private: bool) -> Result<(), ApiError> {
    if input.description.as_ref().is_some_and(|d| d.chars().count() > 4096) {
        return Err(ApiError::invalid("description is longer than 4096 characters"));
    }
    if let Some(url) = &input.callback_url {
        validate::callback_url("callback_url", url, allow_private)?;
    }
    if input.callback_secret.as_ref().is_some_and(|s| s.len() < 16 || s.len() > 1024) {
        return Err(ApiError::invalid("callback_secret must be 16-1024 bytes"));
    }
    validate::retry(&input.retry)?;
    if let Some(problem) = input.circuit_breaker.as_ref().and_then(CircuitBreaker::problem) {
        return Err(ApiError::invalid(problem));
    }
    if let Some(parameters) = &input.parameters {
        ToolSchema::compile(&Value::Object(parameters.clone())).map_err(|e| ApiError::invalid(e.to_string()))?;
    }
    if let Some(Some(schema)) = &input.output_schema {
        ToolSchema::compile_at(&Value::Object(schema.clone()), "output_schema")
            .map_err(|e| ApiError::invalid(e.to_string()))?;
    }
    limits(&ToolLimits::default(), input)?;
    approvals(None, input)?;
    Ok(())
}

/// The approval settings `input` makes of `current`'s; an unknown effect is a 400 naming it.
fn approvals(current: Option<&ApprovalSettings>, input: &ToolInput) -> Result<ApprovalSettings, ApiError> {
    let current = current.cloned().unwrap_or_default();
    let effects = match &input.effects {
        Some(names) => Effect::parse_all("effects", names)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e))?,
        None => current.effects,
    };
    let settings = ApprovalSettings {
        effects,
        requires_approval: input.requires_approval.unwrap_or(current.requires_approval),
        approval_timeout_secs: input.approval_timeout_secs.or(current.approval_timeout_secs),
        approval_timeout_outcome: input.approval_timeout_outcome.or(current.approval_timeout_outcome),
    };
    match settings.problem("") {
        Some(problem) => Err(ApiError::invalid(problem)),
        None => Ok(settings),
    }
}

/// The tool `input` makes of `existing` (or a new one named `name`); `secret_ciphertext` is the
/// input's secret, encrypted. A tool the fleet calls needs a `callback_url` and secret; a client
/// tool has none.
fn merged(
    existing: Option<&StoredTool>,
    name: &str,
    input: &ToolInput,
    secret_ciphertext: Option<String>,
    now: i64,
) -> Result<StoredTool, ApiError> {
    let execution = input.execution.clone().or(existing.map(|t| t.execution.clone())).unwrap_or_default();
    let callback_url = input.callback_url.clone().or_else(|| existing.map(|t| t.callback_url.clone()));
    let secret_ciphertext = secret_ciphertext.or_else(|| existing.map(|t| t.secret_ciphertext.clone()));
    let (callback_url, secret_ciphertext) = match execution {
        ToolExecution::Client if input.callback_url.is_some() || input.callback_secret.is_some() => {
            return Err(ApiError::invalid(
                "callback_url and callback_secret are for tools the fleet calls; a client tool (execution: client) has none",
            ))
        }
        ToolExecution::Client => (String::new(), String::new()),
        ToolExecution::Mcp(_) => {
            return Err(ApiError::invalid(
                "an MCP server's tools are written by its discovery (POST /v1/mcp_servers/{name}/discover), not here",
            ))
        }
        ToolExecution::DataSource(_) => {
            return Err(ApiError::invalid(
                "a data source's tool is written by its registration (POST /v1/data-sources), not here",
            ))
        }
        ToolExecution::Callback => (
            callback_url.filter(|u| !u.is_empty()).ok_or_else(|| ApiError::invalid("callback_url is required"))?,
            secret_ciphertext.filter(|s| !s.is_empty()).ok_or_else(|| ApiError::invalid("callback_secret is required"))?,
        ),
    };
    let default_parameters = || json!({"type": "object", "properties": {}});
    Ok(StoredTool {
        // A tool stored before tools had ids gets one with its first update.
        id: existing.map(|t| t.id.clone()).filter(|id| !id.is_empty()).unwrap_or_else(new_tool_id),
        name: existing.map_or_else(|| name.to_string(), |t| t.name.clone()),
        description: input.description.clone().or_else(|| existing.map(|t| t.description.clone())).unwrap_or_default(),
        parameters: input
            .parameters
            .clone()
            .map(Value::Object)
            .or_else(|| existing.map(|t| t.parameters.clone()))
            .unwrap_or_else(default_parameters),
        callback_url,
        secret_ciphertext,
        created_at_ms: existing.map_or(now, |t| t.created_at_ms),
        updated_at_ms: now,
        signing: existing.map(|t| t.signing.clone()).unwrap_or_default(),
        retry: retry_spec::updated(&input.retry, existing.and_then(|t| t.retry.as_ref())),
        limits: limits(existing.map(|t| &t.limits).unwrap_or(&ToolLimits::default()), input)?,
        circuit_breaker: input.circuit_breaker.or(existing.and_then(|t| t.circuit_breaker)),
        execution: execution.clone(),
        output_schema: match &input.output_schema {
            Some(given) => given.clone().map(Value::Object),
            None => existing.and_then(|t| t.output_schema.clone()),
        },
        approvals: approvals(existing.map(|t| &t.approvals), input)?,
    })
}

/// Refuses (422 `unknown_tool`, naming them) the tools in `names` that are not registered: an
/// assistant or turn may enable registered tools only. `field` names where they were given.
pub(crate) async fn require_registered(state: &AppState, field: &str, names: &[String]) -> Result<(), ApiError> {
    let registered = state.store.registry().tools_registered(names).await?;
    let missing: Vec<String> =
        names.iter().zip(registered).filter(|(_, known)| !known).map(|(name, _)| format!("{name:?}")).collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_tool",
        format!(
            "{field} names {} that {} not registered: {}; register {} first (POST /v1/tools)",
            if missing.len() == 1 { "a tool" } else { "tools" },
            if missing.len() == 1 { "is" } else { "are" },
            missing.join(", "),
            if missing.len() == 1 { "it" } else { "them" },
        ),
    ))
}

fn no_tool(tool: ToolRef<'_>) -> ApiError {
    match tool {
        ToolRef::Id(id) => ApiError::not_found(format!("no tool with id {id:?}")),
        ToolRef::Name(name) => ApiError::not_found(format!("no tool named {name:?}")),
    }
}

/// The tool `tool` names, as stored.
async fn find(state: &AppState, tool: ToolRef<'_>) -> Result<Option<ToolVersion>, ApiError> {
    match tool {
        ToolRef::Name(name) => Ok(state.store.registry().read_tool(name).await?),
        ToolRef::Id(id) => {
            let Some(name) = state.store.registry().tool_name_by_id(id).await? else { return Ok(None) };
            Ok(state.store.registry().read_tool(&name).await?.filter(|v| v.tool.id == id))
        }
    }
}

/// Creates or updates the tool `target` names; `create_only` refuses an existing one (409), an
/// id never creates. Each write is conditional on what was read, so concurrent requests neither
/// lose an update's fields nor make two tools of one name.
async fn save(
    state: &AppState,
    target: ToolRef<'_>,
    create_only: bool,
    input: &ToolInput,
) -> Result<(StatusCode, StoredTool), ApiError> {
    for _ in 0..WRITE_ATTEMPTS {
        let current = find(state, target).await?;
        let name = match (&current, target) {
            (Some(c), _) if create_only => {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "tool_exists",
                    format!(
                        "a tool named {:?} already exists (id {}); PUT /v1/tools/{{id or name}} updates it",
                        c.tool.name, c.tool.id
                    ),
                ))
            }
            (Some(c), _) => c.tool.name.clone(),
            (None, ToolRef::Id(_)) => return Err(no_tool(target)),
            (None, ToolRef::Name(name)) => name.to_string(),
        };
        if input.name.as_deref().is_some_and(|n| n != name) {
            return Err(ApiError::invalid(format!("name in the body must be the tool's name, {name:?}")));
        }
        let owner = format!("tool:{name}");
        let ciphertext = input.callback_secret.as_ref().map(|s| state.config.secrets_key.encrypt(&owner, s));
        let mut tool = merged(current.as_ref().map(|c| &c.tool), &name, input, ciphertext, now_ms())?;
        tool.signing = tool_signing(state, current.as_ref().map(|c| &c.tool), &owner, input)?;
        if state.store.registry().write_tool(&tool, current.as_ref()).await? {
            state.tool_schemas.forget(&name);
            let status = if current.is_none() { StatusCode::CREATED } else { StatusCode::OK };
            return Ok((status, tool));
        }
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "tool_busy",
        "the tool kept changing while this request wrote it; try again",
    ))
}

/// The signing state `input` makes of `existing`'s (`signature`, `rotate_secret`).
fn tool_signing(
    state: &AppState,
    existing: Option<&StoredTool>,
    owner: &str,
    input: &ToolInput,
) -> Result<fleet_protocol::signature_scheme::Signing, ApiError> {
    let request = crate::signing::SigningRequest {
        scheme: input.signature,
        rotate_secret: input.rotate_secret.unwrap_or(false),
        new_secret: input.callback_secret.as_deref(),
        secret_field: "callback_secret",
    };
    let stored =
        existing.map(|t| crate::signing::Stored { signing: &t.signing, secret_ciphertext: &t.secret_ciphertext });
    crate::signing::next_signing(&state.config.secrets_key, owner, stored, request, state.config.secret_rotation_grace)
}

/// Parses and checks a registration body, resolving its callback host when private targets are off.
async fn tool_input(state: &AppState, headers: &HeaderMap, body: &[u8]) -> Result<ToolInput, ApiError> {
    require_json(headers)?;
    let input: ToolInput = validate::parse_body(body)?;
    check_fields(&input, state.config.allow_private_callbacks)?;
    if let (Some(url), false) = (&input.callback_url, state.config.allow_private_callbacks) {
        refuse_private_resolution(url).await?;
    }
    Ok(input)
}

/// `POST /v1/tools`: the seed's registration; 201, or 409 if the name is taken.
#[utoipa::path(post, path = "/v1/tools", extensions(("x-tenancy" = json!("operator"))), tag = "tools", security(("bearer" = ["tools:write", "operator"])),
    request_body(content = ToolInput, description = "The tool (name, callback_url and callback_secret required)"),
    responses((status = 201, description = "Registered", body = Data<ToolOut>),
        (status = 409, description = "A tool of that name exists (`tool_exists`) or kept changing (`tool_busy`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn post_tool(
    State(state): State<AppState>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<(StatusCode, Json<Data<ToolOut>>), ApiError> {
    let input = tool_input(&state, &headers, &body).await?;
    let name = input.name.clone().ok_or_else(|| ApiError::invalid("name is required"))?;
    validate::tool_name(&name)?;
    if is_tool_id(&name) {
        return Err(ApiError::invalid(format!(
            "tool name {name:?} is reserved: names of the form tool_<32 hex digits> are tool ids"
        )));
    }
    let (status, tool) = save(&state, ToolRef::Name(&name), true, &input).await?;
    Ok((status, Data::json(ToolOut::from(&tool))))
}

/// `PUT /v1/tools/{tool}`: by name, creates (201) or updates (200); by id, updates only (404 if none).
#[utoipa::path(put, path = "/v1/tools/{tool}", extensions(("x-tenancy" = json!("operator"))), tag = "tools", security(("bearer" = ["tools:write", "operator"])),
    params(("tool" = String, Path, description = "The tool's name (creates or updates) or id (updates only)")),
    request_body(content = ToolInput, description = "Fields to set (callback_url and callback_secret required to create)"),
    responses((status = 200, description = "Updated", body = Data<ToolOut>),
        (status = 201, description = "Created", body = Data<ToolOut>),
        (status = 404, description = "No tool with that id", body = crate::routes::docs::ErrorBody),
        (status = 409, description = "The tool kept changing (`tool_busy`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn put_tool(
    State(state): State<AppState>,
    Path(tool): Path<String>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<(StatusCode, Json<Data<ToolOut>>), ApiError> {
    let target = ToolRef::parse(&tool);
    if let ToolRef::Name(name) = target {
        validate::tool_name(name)?;
    }
    let input = tool_input(&state, &headers, &body).await?;
    let (status, tool) = save(&state, target, false, &input).await?;
    Ok((status, Data::json(ToolOut::from(&tool))))
}

/// The tool to show: one stored before tools had ids gets its id here, once.
async fn with_id(state: &AppState, version: ToolVersion) -> Result<StoredTool, ApiError> {
    if !version.tool.id.is_empty() {
        return Ok(version.tool);
    }
    let mut tool = version.tool.clone();
    tool.id = new_tool_id();
    if state.store.registry().write_tool(&tool, Some(&version)).await? {
        return Ok(tool);
    }
    // Another request gave it an id (or changed it) meanwhile: show what is stored now.
    Ok(state.store.registry().get_tool(&tool.name).await?.unwrap_or(version.tool))
}

#[utoipa::path(get, path = "/v1/tools/{tool}", extensions(("x-tenancy" = json!("own"))), tag = "tools", security(("bearer" = ["tools:read"])),
    params(("tool" = String, Path, description = "The tool's name or id")),
    responses((status = 200, description = "The tool", body = Data<ToolOut>),
        (status = 404, description = "No such tool", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn get_tool(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path(tool): Path<String>,
) -> Result<Json<Data<ToolOut>>, ApiError> {
    let target = ToolRef::parse(&tool);
    let version = find(&state, target).await?.ok_or_else(|| no_tool(target))?;
    let mut data = ToolOut::from(&with_id(&state, version).await?);
    let health = state.store.limits().tool_health(&data.name).await?;
    let history = state.store.limits().circuit_history(&data.name, 20).await?;
    let health = ToolHealthOut::new(&health, &history);
    data.health = Some(if tenancy.bound.is_some() { health.for_tenants() } else { health });
    Ok(Data::json(data.shown_to(&tenancy)))
}

#[utoipa::path(get, path = "/v1/tools", extensions(("x-tenancy" = json!("own"))), tag = "tools", security(("bearer" = ["tools:read"])), params(crate::routes::common::Page),
    responses((status = 200, description = "Registered tools by name", body = Listed<ToolOut>), crate::routes::docs::CommonErrors))]
pub(crate) async fn list_tools(
    State(state): State<AppState>,
    tenancy: Tenancy,
    ApiQuery(page): ApiQuery<Page>,
) -> Result<Json<Listed<ToolOut>>, ApiError> {
    let limit = page_limit(page.limit)?;
    let versions = state.store.registry().list_tools(page.cursor.as_deref(), limit + 1).await?;
    let next = (versions.len() > limit).then(|| versions[limit - 1].tool.name.clone());
    let mut data = Vec::with_capacity(limit);
    for version in versions.into_iter().take(limit) {
        data.push(ToolOut::from(&with_id(&state, version).await?).shown_to(&tenancy));
    }
    Ok(Listed::json(data, next))
}

#[utoipa::path(delete, path = "/v1/tools/{tool}", extensions(("x-tenancy" = json!("operator"))), tag = "tools", security(("bearer" = ["tools:write", "operator"])),
    params(("tool" = String, Path, description = "The tool's name or id")),
    responses((status = 204, description = "Deleted"),
        (status = 404, description = "No such tool", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn delete_tool(
    State(state): State<AppState>,
    Path(tool): Path<String>,
) -> Result<StatusCode, ApiError> {
    let target = ToolRef::parse(&tool);
    let deleted = match target {
        ToolRef::Name(name) => state.store.registry().delete_tool(name, None).await?.then(|| name.to_string()),
        ToolRef::Id(id) => match state.store.registry().tool_name_by_id(id).await? {
            Some(name) => state.store.registry().delete_tool(&name, Some(id)).await?.then_some(name),
            None => None,
        },
    };
    let name = deleted.ok_or_else(|| no_tool(target))?;
    state.tool_schemas.forget(&name);
    Ok(StatusCode::NO_CONTENT)
}

/// This module's routes, each with its OpenAPI operation (path, method, scope): adding a route
/// here is all it takes to serve, document and guard it.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(list_tools, post_tool))
        .routes(utoipa_axum::routes!(put_tool, get_tool, delete_tool))
        .routes(utoipa_axum::routes!(close_circuit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool_json(t: &StoredTool) -> Value {
        serde_json::to_value(ToolOut::from(t)).unwrap()
    }

    fn input(body: Value) -> ToolInput {
        serde_json::from_value(body).unwrap()
    }

    fn stored(id: &str) -> StoredTool {
        StoredTool {
            id: id.into(),
            name: "t".into(),
            description: "old".into(),
            parameters: json!({"type": "object"}),
            callback_url: "https://a.example/x".into(),
            secret_ciphertext: "v1.old".into(),
            created_at_ms: 1,
            updated_at_ms: 1,
            signing: Default::default(),
            retry: None,
            limits: ToolLimits::default(),
            circuit_breaker: None,
            execution: Default::default(),
            output_schema: None,
            approvals: Default::default(),
        }
    }

    #[test]
    fn an_update_keeps_the_id_and_what_it_does_not_name() {
        let old = stored("tool_0123456789abcdef0123456789abcdef");
        let new = merged(Some(&old), "t", &input(json!({"description": "new"})), None, 5).unwrap();
        assert_eq!((new.id.as_str(), new.description.as_str()), (old.id.as_str(), "new"));
        assert_eq!((new.secret_ciphertext.as_str(), new.created_at_ms, new.updated_at_ms), ("v1.old", 1, 5));
        let legacy = merged(Some(&stored("")), "t", &input(json!({})), None, 5).unwrap();
        assert!(is_tool_id(&legacy.id), "a tool without an id gets one: {}", legacy.id);
    }

    #[test]
    fn a_new_tool_needs_a_url_and_a_secret_and_gets_an_id() {
        let e = merged(None, "t", &input(json!({"callback_secret": "s"})), Some("c".into()), 5).unwrap_err();
        assert!(e.message.contains("callback_url"), "{}", e.message);
        let e = merged(None, "t", &input(json!({"callback_url": "https://a.example"})), None, 5).unwrap_err();
        assert!(e.message.contains("callback_secret"), "{}", e.message);
        let new = merged(None, "t", &input(json!({"callback_url": "https://a.example"})), Some("c".into()), 5).unwrap();
        assert!(is_tool_id(&new.id));
        assert_eq!(new.parameters, json!({"type": "object", "properties": {}}));
    }

    #[test]
    fn fields_are_checked_and_the_schema_must_compile() {
        assert!(check_fields(&input(json!({"parameters": {"type": "object"}})), false).is_ok());
        let e = check_fields(&input(json!({"parameters": {"type": "strnig"}})), false).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.message.starts_with("parameters is not a valid JSON Schema"), "{}", e.message);
        assert!(check_fields(&input(json!({"callback_secret": "short"})), false).is_err());
    }

    #[test]
    fn limits_are_checked_set_kept_and_removed() {
        let e = check_fields(&input(json!({"max_concurrency": 0})), false).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.message.starts_with("max_concurrency"), "{}", e.message);
        let e = check_fields(&input(json!({"rate_limit": {"per_second": 0}})), false).unwrap_err();
        assert!(e.message.starts_with("rate_limit.per_second"), "{}", e.message);
        let body = json!({"max_concurrency": 2, "rate_limit": {"per_second": 5, "burst": 2}});
        let set = merged(Some(&stored("")), "t", &input(body), None, 5).unwrap();
        assert_eq!(set.limits.max_concurrency, Some(2));
        assert_eq!(tool_json(&set)["rate_limit"], json!({"per_second": 5.0, "burst": 2}));
        let kept = merged(Some(&set), "t", &input(json!({"description": "d"})), None, 6).unwrap();
        assert_eq!(kept.limits, set.limits);
        let removed = merged(Some(&kept), "t", &input(json!({"max_concurrency": null})), None, 7).unwrap();
        assert_eq!((removed.limits.max_concurrency, removed.limits.rate_limit), (None, set.limits.rate_limit));
        assert_eq!(tool_json(&removed)["max_concurrency"], Value::Null);
    }
}

/// Closes a tool's circuit by hand (its consecutive failures reset): calls flow again at once
/// instead of after the next successful probe. Written to the audit log.
#[utoipa::path(post, path = "/v1/tools/{tool}/circuit/close", extensions(("x-tenancy" = json!("operator"))), tag = "tools", security(("bearer" = ["tools:write", "operator"])),
    params(("tool" = String, Path, description = "The tool's name or id")),
    responses((status = 200, description = "Closed; `was_open` says whether it was open", body = Data<CircuitClosed>),
        (status = 404, description = "No such tool", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn close_circuit(
    State(state): State<AppState>,
    caller: Option<axum::Extension<crate::routes::common::Caller>>,
    Path(tool): Path<String>,
) -> Result<Json<Data<CircuitClosed>>, ApiError> {
    let target = ToolRef::parse(&tool);
    let version = find(&state, target).await?.ok_or_else(|| no_tool(target))?;
    let name = version.tool.name.clone();
    let actor = crate::routes::audit::actor(caller.as_deref());
    let was_open = state.store.limits().close_circuit(&name, fleet_platform::now_ms(), &actor).await?;
    let detail = json!({"was_open": was_open});
    let count = u64::from(was_open);
    crate::routes::audit::record_api(&state, caller.as_deref(), "circuit.close", &name, count, Some(&detail)).await;
    Ok(Data::json(CircuitClosed { tool_name: name, was_open }))
}
