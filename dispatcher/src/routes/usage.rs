//! `GET /v1/usage`: token usage per hour, of a tenant, an assistant, one tenant's assistant or a
//! session, as the workers count it after each model call (`platform/src/store/usage.rs`). A
//! tenant-bound token sees only its own tenant's (and its own sessions').

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use fleet_protocol::tenant::{self, UsageBucket, UsageScope};
use fleet_protocol::timefmt::{millis_from_rfc3339, rfc3339_from_millis};

use crate::error::ApiError;
use crate::routes::common::{check_session, named_session, ApiQuery, Tenancy};
use crate::wire::Data;
use crate::AppState;

/// The longest range one request reads: 35 days of hours (as long as usage is kept).
const MAX_HOURS: i64 = 35 * 24;
const DAY_MS: i64 = 86_400_000;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct UsageQuery {
    /// A tenant's usage (a tenant-bound token's own by default; another tenant's is not found).
    tenant: Option<String>,
    /// An assistant's usage (with `tenant`: that tenant's use of it).
    assistant: Option<String>,
    /// A session's usage (a room's id is its session's), asked alone or with its `tenant`: a
    /// tenant-bound token's own sessions only (another tenant's is not found); an operator's token
    /// names a tenant's session of that key with `tenant`.
    session: Option<String>,
    /// RFC 3339; default 24 hours before `until`. The hour it falls in is included.
    since: Option<String>,
    /// RFC 3339; default now. The hour it falls in is included; at most 35 days after `since`.
    until: Option<String>,
}

/// Usage per hour over a range.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Usage)]
pub(crate) struct UsageOut {
    tenant: Option<String>,
    assistant: Option<String>,
    session: Option<String>,
    /// RFC 3339, as asked (or defaulted).
    since: String,
    until: String,
    /// The hours with any usage, oldest first.
    buckets: Vec<UsageBucket>,
    /// The buckets' sums.
    total: UsageTotal,
}

/// Usage summed over a range.
#[derive(Debug, Default, Serialize, ToSchema)]
pub(crate) struct UsageTotal {
    prompt_tokens: u64,
    completion_tokens: u64,
    requests: u64,
}

impl UsageTotal {
    fn of(buckets: &[UsageBucket]) -> Self {
        buckets.iter().fold(Self::default(), |t, b| Self {
            prompt_tokens: t.prompt_tokens + b.prompt_tokens,
            completion_tokens: t.completion_tokens + b.completion_tokens,
            requests: t.requests + b.requests,
        })
    }
}

/// Tokens the fleet's model calls used, per hour (UTC), for a tenant, an assistant, a tenant's
/// use of an assistant, or a session; kept 35 days. Counted once per model call that answered.
#[utoipa::path(get, path = "/v1/usage", extensions(("x-tenancy" = json!("resource"))), tag = "usage", security(("bearer" = ["usage:read"])),
    params(UsageQuery),
    responses((status = 200, description = "Usage per hour", body = Data<UsageOut>),
        (status = 404, description = "Another tenant's usage, assistant or session, asked with a tenant-bound token", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn get_usage(
    State(state): State<AppState>,
    tenancy: Tenancy,
    ApiQuery(q): ApiQuery<UsageQuery>,
) -> Result<Json<Data<UsageOut>>, ApiError> {
    let bound = tenancy.bound.as_deref();
    let session = q.session.filter(|s| !s.is_empty());
    let asked_tenant = q.tenant.filter(|t| !t.is_empty());
    let assistant = q.assistant.filter(|a| !a.is_empty());
    if session.is_some() && assistant.is_some() {
        return Err(ApiError::invalid("session is asked alone or with its tenant, without assistant"));
    }
    // A tenant's session is its own of that key: its usage is counted under its stored id (an
    // operator names the tenant whose session it is).
    let stored = session.as_deref().map(|s| named_session(&tenancy, s, asked_tenant.as_deref())).transpose()?;
    let tenant = match &stored {
        Some(s) => {
            check_session(&state, &tenancy, s).await?;
            None
        }
        None => whose(bound, asked_tenant)?,
    };
    if let (Some(b), Some(a)) = (bound, assistant.as_deref()) {
        hidden_assistant(&state, b, a).await?;
    }
    let scope = match (&tenant, &assistant, &stored) {
        (_, _, Some(s)) => UsageScope::Session(s),
        (Some(t), Some(a), _) => UsageScope::TenantAssistant(t, a),
        (Some(t), None, _) => UsageScope::Tenant(t),
        (None, Some(a), _) => UsageScope::Assistant(a),
        (None, None, None) => return Err(ApiError::invalid("give tenant, assistant (or both), or session")),
    };
    let (since, until) = range(q.since.as_deref(), q.until.as_deref(), fleet_platform::now_ms())?;
    let hours = tenant::hours(since, until, MAX_HOURS)
        .ok_or_else(|| ApiError::invalid("since must not be after until, nor more than 35 days before it"))?;
    let buckets = state.store.limits().usage_buckets(scope, &hours).await?;
    let (since, until) = (rfc3339_from_millis(since), rfc3339_from_millis(until));
    let total = UsageTotal::of(&buckets);
    Ok(Data::json(UsageOut { tenant, assistant, session, since, until, buckets, total }))
}

/// 404 for another tenant's assistant, asked about with a token bound to `bound` (an id no
/// assistant has, a name a tool call gave, is no one's and answers its buckets).
async fn hidden_assistant(state: &AppState, bound: &str, assistant: &str) -> Result<(), ApiError> {
    if !fleet_protocol::agents::is_id("asst_", assistant) {
        return Ok(());
    }
    match state.store.registry().get_assistant(assistant).await? {
        Some(a) if !a.seen_by(Some(bound)) => Err(ApiError::not_found(format!("no usage of assistant {assistant:?}"))),
        _ => Ok(()),
    }
}

/// The tenant a query is about: a bound token's own (another answers 404, as if there were none).
fn whose(bound: Option<&str>, asked: Option<String>) -> Result<Option<String>, ApiError> {
    match (bound, asked) {
        (Some(b), Some(a)) if a != b => Err(ApiError::not_found(format!("no usage of tenant {a:?}"))),
        (Some(b), _) => Ok(Some(b.to_string())),
        (None, Some(a)) if !tenant::is_tenant_name(&a) => {
            Err(ApiError::invalid("tenant must be 1-64 characters of A-Z, a-z, 0-9, '.', '_' and '-'"))
        }
        (None, asked) => Ok(asked),
    }
}

/// `since` and `until` in ms, defaulted: until now, since a day before until.
fn range(since: Option<&str>, until: Option<&str>, now_ms: i64) -> Result<(i64, i64), ApiError> {
    let parse = |name: &str, v: &str| {
        millis_from_rfc3339(v).ok_or_else(|| ApiError::invalid(format!("{name} must be an RFC 3339 time")))
    };
    let until = until.map(|u| parse("until", u)).transpose()?.unwrap_or(now_ms);
    let since = since.map(|s| parse("since", s)).transpose()?.unwrap_or(until - DAY_MS + 1);
    Ok((since, until))
}

/// This module's routes, each with its OpenAPI operation (path, method, scope): adding a route
/// here is all it takes to serve, document and guard it.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new().routes(utoipa_axum::routes!(get_usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_token_sees_only_its_tenant_and_others_are_not_found() {
        assert_eq!(whose(Some("a"), None).unwrap().as_deref(), Some("a"));
        assert_eq!(whose(Some("a"), Some("a".into())).unwrap().as_deref(), Some("a"));
        assert_eq!(whose(Some("a"), Some("b".into())).unwrap_err().status, axum::http::StatusCode::NOT_FOUND);
        assert_eq!(whose(None, Some("b".into())).unwrap().as_deref(), Some("b"));
        assert_eq!(whose(None, None).unwrap(), None);
        assert!(whose(None, Some("b|c".into())).is_err());
    }

    #[test]
    fn the_range_defaults_to_the_last_day_and_refuses_bad_times() {
        assert_eq!(range(None, None, DAY_MS * 3).unwrap(), (DAY_MS * 2 + 1, DAY_MS * 3));
        let (s, u) = range(Some("1970-01-01T01:00:00Z"), Some("1970-01-01T02:00:00Z"), 0).unwrap();
        assert_eq!((s, u), (3_600_000, 7_200_000));
        assert!(range(Some("yesterday"), None, 0).is_err());
    }
}
