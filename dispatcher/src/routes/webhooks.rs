//! The webhook registry: `GET /v1/webhooks`, `PUT|GET|DELETE /v1/webhooks/{id}`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use fleet_platform::now_ms;
use fleet_platform::store::StoredWebhook;
use fleet_protocol::retry_spec::{self, RetrySpec};
use fleet_protocol::timefmt::rfc3339_from_millis;

use crate::error::ApiError;
use crate::routes::common::{page_limit, refuse_private_resolution, ApiQuery, JsonInput, Page};
use crate::wire::{Data, Listed};
use crate::{validate, AppState};

/// On create, all of `url`, `secret` and `events` are required; on update, fields left out keep
/// their value.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WebhookInput {
    url: Option<String>,
    /// 16-1024 bytes; stored encrypted, never returned. Under `standard-webhooks`: `whsec_` and
    /// base64 of at least 24 bytes.
    secret: Option<String>,
    /// At least one known event.
    events: Option<Vec<String>>,
    /// How deliveries are signed; `interactor` (the seed's) unless set.
    signature: Option<fleet_protocol::signature_scheme::SignatureScheme>,
    /// With a new `secret`: keep the previous one for `FLEET_SECRET_ROTATION_GRACE`.
    rotate_secret: Option<bool>,
    /// The webhook's retry schedule; `null` goes back to the fleet's default.
    #[serde(default, deserialize_with = "fleet_protocol::retry_spec::explicit_null")]
    #[schema(value_type = Option<RetrySpec>)]
    retry: Option<Option<RetrySpec>>,
}

/// A webhook as the API shows it (never its secret).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Webhook)]
pub(crate) struct WebhookOut {
    id: String,
    url: String,
    events: Vec<String>,
    signature: fleet_protocol::signature_scheme::SignatureScheme,
    /// RFC 3339: when the secret replaced by `rotate_secret` expires; null outside a rotation.
    previous_secret_expires_at: Option<String>,
    /// The webhook's own retry schedule, or `null`: the fleet's default.
    retry: Option<RetrySpec>,
    created_at: String,
    updated_at: String,
}

impl From<&StoredWebhook> for WebhookOut {
    fn from(h: &StoredWebhook) -> Self {
        Self {
            id: h.id.clone(),
            url: h.url.clone(),
            events: h.events.clone(),
            signature: h.signing.scheme,
            previous_secret_expires_at: crate::signing::previous_secret_expires_at(&h.signing),
            retry: h.retry.clone(),
            created_at: rfc3339_from_millis(h.created_at_ms),
            updated_at: rfc3339_from_millis(h.updated_at_ms),
        }
    }
}

#[utoipa::path(put, path = "/v1/webhooks/{id}", extensions(("x-tenancy" = json!("operator"))), tag = "webhooks", security(("bearer" = ["webhooks:write", "operator"])),
    params(("id" = String, Path, description = "1-64 letters, digits, `_` or `-`")),
    request_body = WebhookInput,
    responses((status = 200, description = "Updated", body = Data<WebhookOut>),
        (status = 201, description = "Created", body = Data<WebhookOut>), crate::routes::docs::CommonErrors))]
pub(crate) async fn put_webhook(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonInput { value: input, .. }: JsonInput<WebhookInput>,
) -> Result<(StatusCode, Json<Data<WebhookOut>>), ApiError> {
    validate::tool_name(&id)
        .map_err(|_| ApiError::invalid("webhook id must be 1-64 characters of letters, digits, '_' or '-'"))?;
    if let Some(url) = &input.url {
        validate::callback_url("url", url, state.config.allow_private_callbacks)?;
        if !state.config.allow_private_callbacks {
            refuse_private_resolution(url).await?;
        }
    }
    if let Some(secret) = &input.secret {
        if secret.len() < 16 || secret.len() > 1024 {
            return Err(ApiError::invalid("secret must be 16-1024 bytes"));
        }
    }
    if let Some(events) = &input.events {
        if events.is_empty() {
            return Err(ApiError::invalid("events must list at least one event"));
        }
        if let Some(unknown) = events.iter().find(|e| !fleet_protocol::events::is_known(e)) {
            return Err(ApiError::invalid(format!(
                "events: {unknown:?} is not an event; known events are {}",
                fleet_protocol::events::KNOWN_EVENTS.join(", ")
            )));
        }
    }
    validate::retry(&input.retry)?;
    let owner = format!("webhook:{id}");
    let now = now_ms();
    let existing = state.store.registry().get_webhook(&id).await?;
    let signing = webhook_signing(&state, existing.as_ref(), &owner, &input)?;
    let hook = match existing {
        Some(old) => StoredWebhook {
            id: id.clone(),
            url: input.url.unwrap_or(old.url),
            events: input.events.unwrap_or(old.events),
            secret_ciphertext: match input.secret {
                Some(s) => state.config.secrets_key.encrypt(&owner, &s),
                None => old.secret_ciphertext,
            },
            created_at_ms: old.created_at_ms,
            updated_at_ms: now,
            signing,
            retry: retry_spec::updated(&input.retry, old.retry.as_ref()),
        },
        None => StoredWebhook {
            id: id.clone(),
            url: input.url.ok_or_else(|| ApiError::invalid("url is required"))?,
            events: input.events.ok_or_else(|| ApiError::invalid("events is required"))?,
            secret_ciphertext: state
                .config
                .secrets_key
                .encrypt(&owner, &input.secret.ok_or_else(|| ApiError::invalid("secret is required"))?),
            created_at_ms: now,
            updated_at_ms: now,
            signing,
            retry: retry_spec::updated(&input.retry, None),
        },
    };
    let created = state.store.registry().put_webhook(&hook).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Data::json(WebhookOut::from(&hook))))
}

/// The signing state `input` makes of `existing`'s (`signature`, `rotate_secret`).
fn webhook_signing(
    state: &AppState,
    existing: Option<&StoredWebhook>,
    owner: &str,
    input: &WebhookInput,
) -> Result<fleet_protocol::signature_scheme::Signing, ApiError> {
    let request = crate::signing::SigningRequest {
        scheme: input.signature,
        rotate_secret: input.rotate_secret.unwrap_or(false),
        new_secret: input.secret.as_deref(),
        secret_field: "secret",
    };
    let stored =
        existing.map(|h| crate::signing::Stored { signing: &h.signing, secret_ciphertext: &h.secret_ciphertext });
    crate::signing::next_signing(&state.config.secrets_key, owner, stored, request, state.config.secret_rotation_grace)
}

#[utoipa::path(get, path = "/v1/webhooks/{id}", extensions(("x-tenancy" = json!("operator"))), tag = "webhooks", security(("bearer" = ["webhooks:read", "operator"])),
    params(("id" = String, Path, description = "The webhook id")),
    responses((status = 200, description = "The webhook", body = Data<WebhookOut>),
        (status = 404, description = "No such webhook", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn get_webhook(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Data<WebhookOut>>, ApiError> {
    let hook = state
        .store
        .registry()
        .get_webhook(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no webhook {id:?}")))?;
    Ok(Data::json(WebhookOut::from(&hook)))
}

#[utoipa::path(get, path = "/v1/webhooks", extensions(("x-tenancy" = json!("operator"))), tag = "webhooks", security(("bearer" = ["webhooks:read", "operator"])), params(crate::routes::common::Page),
    responses((status = 200, description = "Webhooks by id", body = Listed<WebhookOut>), crate::routes::docs::CommonErrors))]
pub(crate) async fn list_webhooks(
    State(state): State<AppState>,
    ApiQuery(page): ApiQuery<Page>,
) -> Result<Json<Listed<WebhookOut>>, ApiError> {
    let limit = page_limit(page.limit)?;
    let hooks = state.store.registry().list_webhooks(page.cursor.as_deref(), limit + 1).await?;
    let next = (hooks.len() > limit).then(|| hooks[limit - 1].id.clone());
    Ok(Listed::json(hooks.iter().take(limit).map(WebhookOut::from).collect(), next))
}

#[utoipa::path(delete, path = "/v1/webhooks/{id}", extensions(("x-tenancy" = json!("operator"))), tag = "webhooks", security(("bearer" = ["webhooks:write", "operator"])),
    params(("id" = String, Path, description = "The webhook id")),
    responses((status = 204, description = "Deleted"),
        (status = 404, description = "No such webhook", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn delete_webhook(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if state.store.registry().delete_webhook(&id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("no webhook {id:?}")))
    }
}

/// This module's routes, each with its OpenAPI operation (path, method, scope): adding a route
/// here is all it takes to serve, document and guard it.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new().routes(utoipa_axum::routes!(list_webhooks)).routes(utoipa_axum::routes!(
        put_webhook,
        get_webhook,
        delete_webhook
    ))
}

/// Refuses (422 `unknown_output_sink`) an output sink that is not a registered webhook listing
/// `output.delivery`: a turn's final message must have somewhere that answers receipts.
pub(crate) async fn require_output_sink(state: &AppState, sink: Option<&str>) -> Result<(), ApiError> {
    let Some(id) = sink else { return Ok(()) };
    let event = fleet_protocol::events::OUTPUT_DELIVERY;
    match state.store.registry().get_webhook(id).await? {
        Some(hook) if hook.events.iter().any(|e| e == event) => Ok(()),
        Some(_) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_output_sink",
            format!("output_sink {id:?} is a webhook that does not list {event:?} in its events"),
        )),
        None => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_output_sink",
            format!("output_sink {id:?} is not a registered webhook; register it with events [{event:?}] first (PUT /v1/webhooks/{id})"),
        )),
    }
}
