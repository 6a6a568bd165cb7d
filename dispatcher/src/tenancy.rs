//! Whose work a request may create or see, as the authentication layer decided it: a bottom
//! module, read by every route and by the stream-token admission.

use crate::error::ApiError;

/// Whose work a request may create or see: the tenant its token is bound to, if any, and the
/// token's name (`token-` and the first 8 hex digits of its digest), the tenant of an unbound
/// token's work when the request names none. A request admitted by a stream token has none.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tenancy {
    pub(crate) bound: Option<String>,
    pub(crate) name: String,
}

impl Tenancy {
    /// The tenant of new work that names `requested` (`tenant::resolve`); 422 when refused.
    pub(crate) fn resolve(&self, requested: Option<&str>) -> Result<String, ApiError> {
        fleet_protocol::tenant::resolve(self.bound.as_deref(), requested, &self.name).map_err(ApiError::invalid)
    }
}

impl Tenancy {
    /// The stored id of the session the caller calls `key`: a bound caller's is its tenant's own
    /// (`tenant::session_storage_id`), so no other tenant's key can name it.
    pub(crate) fn session(&self, key: &str) -> String {
        fleet_protocol::tenant::session_storage_id(self.bound.as_deref(), key).into_owned()
    }

    /// Whether the caller may see work of `owner`: an unbound token sees every tenant's.
    pub(crate) fn sees(&self, owner: Option<&str>) -> bool {
        self.bound.is_none() || self.bound.as_deref() == owner
    }
}

/// The caller's tenancy as the authentication layer decided it. A handler takes `Tenancy` itself:
/// a request that reached it with no decision (a route outside that layer) is refused, never
/// treated as seeing every tenant.
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Tenancy {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, ApiError> {
        parts.extensions.get::<Tenancy>().cloned().ok_or_else(ApiError::unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::FromRequestParts;

    #[tokio::test]
    async fn a_request_the_authentication_layer_did_not_decide_is_refused() {
        let (mut parts, _) = axum::http::Request::builder().body(()).unwrap().into_parts();
        let refused = Tenancy::from_request_parts(&mut parts, &()).await.unwrap_err();
        assert_eq!(refused.status, axum::http::StatusCode::UNAUTHORIZED);
        parts.extensions.insert(Tenancy { bound: Some("acme".into()), name: "token-1".into() });
        let decided = Tenancy::from_request_parts(&mut parts, &()).await.unwrap();
        assert!(decided.sees(Some("acme")) && !decided.sees(Some("beta")) && !decided.sees(None));
    }
}
