//! The webhook registry: `GET /v1/webhooks`, `PUT|GET|DELETE /v1/webhooks/{id}`.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use fleet_platform::now_ms;
use fleet_platform::store::StoredWebhook;
use fleet_protocol::retry_spec::{self, RetrySpec};
use fleet_protocol::timefmt::rfc3339_from_millis;

use crate::error::ApiError;
use crate::routes::common::{page_limit, refuse_private_resolution, require_json, ApiQuery, Body, Page};
use crate::{validate, AppState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookInput {
    url: Option<String>,
    secret: Option<String>,
    events: Option<Vec<String>>,
    /// `interactor` (default) or `standard-webhooks`; see `crate::signing`.
    signature: Option<fleet_protocol::signature_scheme::SignatureScheme>,
    /// With a new `secret`: keep the previous one for the grace period.
    rotate_secret: Option<bool>,
    /// The webhook's retry schedule; `null` goes back to the fleet's default.
    #[serde(default, deserialize_with = "fleet_protocol::retry_spec::explicit_null")]
    retry: Option<Option<RetrySpec>>,
}

fn webhook_json(h: &StoredWebhook) -> Value {
    json!({
        "id": h.id,
        "url": h.url,
        "events": h.events,
        "signature": h.signing.scheme,
        "previous_secret_expires_at": crate::signing::previous_secret_expires_at(&h.signing),
        "retry": h.retry,
        "created_at": rfc3339_from_millis(h.created_at_ms),
        "updated_at": rfc3339_from_millis(h.updated_at_ms),
    })
}

#[utoipa::path(put, path = "/v1/webhooks/{id}", tag = "webhooks", security(("bearer" = ["webhooks:write"])),
    params(("id" = String, Path, description = "1-64 letters, digits, `_` or `-`")),
    request_body = crate::routes::docs::WebhookInputDoc,
    responses((status = 200, description = "Updated", body = crate::routes::docs::WebhookResponse),
        (status = 201, description = "Created", body = crate::routes::docs::WebhookResponse), crate::routes::docs::CommonErrors))]
pub(crate) async fn put_webhook(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Response, ApiError> {
    require_json(&headers)?;
    validate::tool_name(&id)
        .map_err(|_| ApiError::invalid("webhook id must be 1-64 characters of letters, digits, '_' or '-'"))?;
    let input: WebhookInput = validate::parse_body(&body)?;
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
    let existing = state.store.get_webhook(&id).await?;
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
    let created = state.store.put_webhook(&hook).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!({"data": webhook_json(&hook)}))).into_response())
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

#[utoipa::path(get, path = "/v1/webhooks/{id}", tag = "webhooks", security(("bearer" = ["webhooks:read"])),
    params(("id" = String, Path, description = "The webhook id")),
    responses((status = 200, description = "The webhook", body = crate::routes::docs::WebhookResponse),
        (status = 404, description = "No such webhook", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn get_webhook(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let hook = state.store.get_webhook(&id).await?.ok_or_else(|| ApiError::not_found(format!("no webhook {id:?}")))?;
    Ok(Json(json!({"data": webhook_json(&hook)})))
}

#[utoipa::path(get, path = "/v1/webhooks", tag = "webhooks", security(("bearer" = ["webhooks:read"])), params(crate::routes::common::Page),
    responses((status = 200, description = "Webhooks by id", body = crate::routes::docs::WebhookList), crate::routes::docs::CommonErrors))]
pub(crate) async fn list_webhooks(
    State(state): State<AppState>,
    ApiQuery(page): ApiQuery<Page>,
) -> Result<Json<Value>, ApiError> {
    let limit = page_limit(page.limit)?;
    let hooks = state.store.list_webhooks(page.cursor.as_deref(), limit + 1).await?;
    let next = (hooks.len() > limit).then(|| hooks[limit - 1].id.clone());
    let data: Vec<Value> = hooks.iter().take(limit).map(webhook_json).collect();
    Ok(Json(json!({"data": data, "next_cursor": next})))
}

#[utoipa::path(delete, path = "/v1/webhooks/{id}", tag = "webhooks", security(("bearer" = ["webhooks:write"])),
    params(("id" = String, Path, description = "The webhook id")),
    responses((status = 204, description = "Deleted"),
        (status = 404, description = "No such webhook", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn delete_webhook(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if state.store.delete_webhook(&id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("no webhook {id:?}")))
    }
}
