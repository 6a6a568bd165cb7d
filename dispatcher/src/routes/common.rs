//! Request helpers every route shares: bearer-token auth and scopes, the raw body with a JSON 413, the
//! Content-Type check, paging, and the callback host's DNS check.

use axum::extract::{FromRequest, MatchedPath, Path, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::RequestPartsExt;
use bytes::Bytes;
use fleet_platform::now_ms;
use fleet_protocol::stream_token;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::scopes::{Grant, RouteRule};
use crate::AppState;

/// Which client a request came from: a digest of its token, to namespace its `Idempotency-Key`s.
#[derive(Clone)]
pub(crate) struct Caller(pub(crate) String);

pub(crate) use crate::tenancy::Tenancy;

/// The stored id of the session a request names by `key`, under the caller's tenancy. An operator
/// (an unbound token) names a tenant's session with `tenant` (`?tenant=`); a bound caller may name
/// only its own tenant there (another's is as if it did not exist).
pub(crate) fn named_session(tenancy: &Tenancy, key: &str, tenant: Option<&str>) -> Result<String, ApiError> {
    crate::validate::identifier("session id", Some(key))?;
    match (tenancy.bound.as_deref(), tenant.filter(|t| !t.is_empty())) {
        (Some(bound), Some(named)) if bound != named => Err(ApiError::not_found(format!("no session {key:?}"))),
        (None, Some(named)) if !fleet_protocol::tenant::is_tenant_name(named) => {
            Err(ApiError::invalid("tenant must be 1-64 characters of A-Z, a-z, 0-9, '.', '_' and '-'"))
        }
        (None, Some(named)) => Ok(fleet_protocol::tenant::session_storage_id(Some(named), key).into_owned()),
        _ => Ok(tenancy.session(key)),
    }
}

/// A tenant-bound caller's request about `session`: 404 unless its own tenant holds it (another
/// tenant's session, or one nobody's turn made yet, is as if it did not exist: no one listens to
/// a session before its owner's first turn). An unbound caller costs no read.
pub(crate) async fn check_session(state: &AppState, tenancy: &Tenancy, session: &str) -> Result<(), ApiError> {
    if tenancy.bound.is_none() {
        return Ok(());
    }
    let owner = state.store.sessions().session_tenant(session).await?;
    if owner.is_none() || !tenancy.sees(owner.as_deref()) {
        return Err(ApiError::not_found(format!("no session {session:?}")));
    }
    Ok(())
}

/// Binds `session` to `tenant`, the tenant of a turn about to be made in it, unless another holds
/// it; a tenant-bound caller may not make turns in another tenant's session (404).
pub(crate) async fn claim_session(
    state: &AppState,
    tenancy: &Tenancy,
    session: &str,
    tenant: &str,
) -> Result<(), ApiError> {
    let holders = state.store.sessions().claim_session(session, Some(tenant), None).await?;
    if !tenancy.sees(holders.tenant.as_deref()) {
        return Err(ApiError::not_found(format!("no session {session:?}")));
    }
    Ok(())
}

/// The name of the token with `digest`: not secret, stable, and not the token.
pub(crate) fn token_name(digest: &[u8; 32]) -> String {
    format!("token-{}", hex::encode(&digest[..4]))
}

pub(crate) async fn require_token(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_credential);
    let Some(token) = token else {
        // Only a session stream accepts a (stream) token in its query string instead.
        return match admit_by_stream_token(&state, request).await {
            Ok(request) => next.run(request).await,
            Err(refused) => refused.into_response(),
        };
    };
    let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    // Digests are compared, so timing reveals nothing about the tokens themselves.
    let Some(known) = state.config.tokens.iter().find(|t| t.digest == digest) else {
        return ApiError::unauthorized().into_response();
    };
    let route = request.extensions().get::<MatchedPath>().map(|p| p.as_str()).unwrap_or("");
    let rule = crate::routes::route_rules().get(request.method(), route);
    if let Err(refused) = check_scope(known.grant, rule, request.method(), route) {
        return refused.into_response();
    }
    if known.tenant.is_some() && rule.is_some_and(|r| r.operator_only) {
        return ApiError::operator_only(request.method().as_str(), route).into_response();
    }
    request.extensions_mut().insert(Caller(hex::encode(&digest[..16])));
    request.extensions_mut().insert(Tenancy { bound: known.tenant.clone(), name: token_name(&digest) });
    next.run(request).await
}

/// The credential of an `Authorization: Bearer …` header; the scheme's case does not matter
/// (RFC 7235: auth schemes are case-insensitive).
fn bearer_credential(value: &str) -> Option<&str> {
    let (scheme, credential) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| credential.trim()).filter(|c| !c.is_empty())
}

/// Whether `grant` allows the route; a route without a rule is open to full-rights tokens only.
fn check_scope(grant: Grant, rule: Option<RouteRule>, method: &Method, route: &str) -> Result<(), ApiError> {
    match rule.map(|r| r.scope) {
        Some(scope) if !grant.allows(scope) => {
            Err(ApiError::insufficient_scope(scope.as_str(), method.as_str(), route))
        }
        None if grant != Grant::Full => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "insufficient_scope",
            format!("{} {route} is open to full-rights tokens only", method.as_str()),
        )),
        _ => Ok(()),
    }
}

/// A query string, with one that does not parse answered in the API's JSON error shape (axum's own
/// rejection is plain text).
pub(crate) struct ApiQuery<T>(pub(crate) T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(ApiQuery(value)),
            Err(rejection) => Err(ApiError::invalid(format!("query string: {}", rejection.body_text()))),
        }
    }
}

/// The raw body, with a too-large body answered as a JSON 413.
pub(crate) struct Body(pub(crate) Bytes);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(Body(bytes)),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                "request body exceeds the size limit",
            )),
            Err(rejection) => Err(ApiError::malformed(format!("cannot read request body: {rejection}"))),
        }
    }
}

/// The opening every JSON route shares: the `Content-Type` check, the body read within its size
/// limit, and the parse (400 for what is not JSON, 422 naming the field). `raw` keeps the bytes
/// for a route that digests them.
pub(crate) struct JsonInput<T> {
    pub(crate) value: T,
    pub(crate) raw: Bytes,
}

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for JsonInput<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        require_json(req.headers())?;
        let Body(raw) = Body::from_request(req, state).await?;
        let value = crate::validate::parse_body(&raw)?;
        Ok(Self { value, raw })
    }
}

/// A request's `Idempotency-Key`, checked and namespaced by the caller's token.
pub(crate) struct RequestKey(pub(crate) Option<String>);

impl axum::extract::FromRequestParts<AppState> for RequestKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &AppState) -> Result<Self, ApiError> {
        let Some(v) = parts.headers.get("idempotency-key") else { return Ok(Self(None)) };
        let caller = parts.extensions.get::<Caller>().ok_or_else(ApiError::unauthorized)?;
        let k = v.to_str().map_err(|_| ApiError::malformed("Idempotency-Key must be visible ASCII"))?;
        crate::validate::idempotency_key(k)?;
        Ok(Self(Some(state.store.keys().request_key(&caller.0, &hex::encode(Sha256::digest(k.as_bytes()))))))
    }
}

pub(crate) fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    match headers.get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) {
        None => Ok(()),
        Some(ct) if ct.split(';').next().map(str::trim).is_some_and(|m| m.eq_ignore_ascii_case("application/json")) => {
            Ok(())
        }
        Some(other) => Err(ApiError::malformed(format!("Content-Type must be application/json, got {other:?}"))),
    }
}

/// Refuses a callback host whose DNS answer includes a private address (the worker checks again
/// at connect time, so a later rebinding fails there).
pub(crate) async fn refuse_private_resolution(raw: &str) -> Result<(), ApiError> {
    let Ok(url) = url::Url::parse(raw) else { return Ok(()) };
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else { return Ok(()) };
    if host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[') {
        return Ok(());
    }
    let lookup = tokio::time::timeout(std::time::Duration::from_secs(2), tokio::net::lookup_host((host, port))).await;
    if let Ok(Ok(addrs)) = lookup {
        if addrs.into_iter().any(|a| fleet_protocol::ssrf::is_forbidden(a.ip())) {
            return Err(ApiError::invalid(
                "callback_url resolves to a loopback, private, link-local or metadata address, which is not allowed",
            ));
        }
    }
    Ok(())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct Page {
    /// `next_cursor` from the previous page.
    pub(crate) cursor: Option<String>,
    /// 1-200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub(crate) limit: Option<usize>,
}

pub(crate) fn page_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    match limit.unwrap_or(50) {
        n @ 1..=200 => Ok(n),
        _ => Err(ApiError::invalid("limit must be between 1 and 200")),
    }
}

/// The routes a stream token opens, as the router names them: a session's stream, and a room's
/// (a room is a session: its id is the session's).
const STREAM_ROUTES: [&str; 2] = ["/v1/sessions/{id}/stream", "/v1/agents/rooms/{room_id}/stream"];
/// What the stream-token key is derived for from `FLEET_SECRETS_KEY`.
pub(crate) const TOKEN_KEY_PURPOSE: &str = "stream-token";

/// Authenticates a request that has no `Authorization` header by its `?token=`: only a stream
/// request, only with a valid, unexpired token for that request's session.
pub(crate) async fn admit_by_stream_token(state: &AppState, request: Request) -> Result<Request, ApiError> {
    let on_stream_route =
        request.extensions().get::<MatchedPath>().is_some_and(|p| STREAM_ROUTES.contains(&p.as_str()));
    let token = request.uri().query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == "token").map(|(_, v)| v.into_owned())
    });
    let (Some(token), true) = (token, on_stream_route) else { return Err(ApiError::unauthorized()) };
    let (mut parts, body) = request.into_parts();
    let Path(session_id) = parts.extract::<Path<String>>().await.map_err(|e| ApiError::malformed(e.body_text()))?;
    let key = state.config.secrets_key.subkey(TOKEN_KEY_PURPOSE);
    let tenant = stream_token::verify(&key, &token, &session_id, now_ms())
        .map_err(|e| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", e.to_string()))?;
    // The token was made for this one session, for a caller who could read it then: it decides
    // the tenancy of this request (whose session of that key), which reads nothing else.
    let name = "stream-token".to_string();
    parts.extensions.insert(Tenancy { bound: tenant, name });
    Ok(Request::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    use super::bearer_credential;

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_needs_a_credential() {
        for header in ["Bearer tok", "bearer tok", "BEARER  tok ", " Bearer tok"] {
            assert_eq!(bearer_credential(header), Some("tok"), "{header:?}");
        }
        for header in ["Basic dG9rOg==", "Bearer", "Bearer ", "Bearertok", "tok"] {
            assert_eq!(bearer_credential(header), None, "{header:?}");
        }
    }
}
