//! Console access: a login with an API token (its form checked against a login cookie, so no
//! other site can log a browser in) becomes a session (a random id in an `HttpOnly`,
//! `SameSite=Strict` cookie, `Secure` behind TLS; its grant and CSRF token in Redis). Every page
//! needs a session; every change (a POST) needs the session's CSRF token and a grant that may
//! change things (a full-rights token or `console:admin`; `console:read` only looks).

use std::collections::HashMap;

use axum::extract::{ConnectInfo, Form, FromRequest, FromRequestParts, Request, State};
use axum::http::{header, request::Parts, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use sha2::{Digest, Sha256};

use crate::console::html::{self, Viewer};
use crate::scopes::{Grant, Scope};
use crate::AppState;

pub(crate) const COOKIE: &str = "fleet_console";
const SESSION_TTL_SECS: u64 = 8 * 3600;
/// Failed logins one source address may make in a window before it is refused (429) until the
/// window ends: enough for a person's typos, far too few to guess a token.
const LOGIN_FAILURES_ALLOWED: u64 = 10;
const LOGIN_WINDOW_SECS: u64 = 300;

/// What a grant may do in the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    None,
    Read,
    Change,
}

pub(crate) fn access(grant: Grant) -> Access {
    if grant.allows(Scope::ConsoleAdmin) {
        Access::Change
    } else if grant.allows(Scope::ConsoleRead) {
        Access::Read
    } else {
        Access::None
    }
}

/// The logged-in operator of a request.
#[derive(Debug, Clone)]
pub(crate) struct Operator {
    pub actor: String,
    pub can_change: bool,
    pub csrf: String,
}

impl Operator {
    pub(crate) fn viewer(&self) -> Viewer<'_> {
        Viewer { actor: &self.actor, can_change: self.can_change, csrf: &self.csrf }
    }
}

/// The value of cookie `name` in a `Cookie` header.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(k, v)| (k == name).then_some(v))
}

/// The session cookie: `Secure` when the request came over TLS (as a proxy in front says).
pub(crate) fn session_cookie(id: &str, max_age: u64, secure: bool) -> String {
    format!(
        "{COOKIE}={id}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={max_age}{}",
        if secure { "; Secure" } else { "" }
    )
}

fn over_tls(headers: &HeaderMap) -> bool {
    headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()).is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

impl FromRequestParts<AppState> for Operator {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let to_login = || Redirect::to("/console/login").into_response();
        let Some(id) = cookie(&parts.headers, COOKIE).filter(|id| id.len() == 64) else { return Err(to_login()) };
        let fields = state.store.console().console_session(id).await.map_err(|e| unavailable(&e.to_string()))?;
        let (Some(actor), Some(csrf)) = (fields.get("actor"), fields.get("csrf")) else { return Err(to_login()) };
        // The session is only as good as its token is now: revoked, bound to a tenant since, or
        // cut to no console scope, it ends; cut to `console:read`, it only looks from then on.
        let access = fields.get("token").and_then(|digest| current_access(state, digest));
        let Some(access) = access else {
            let _ = state.store.console().console_session_end(id).await;
            return Err(to_login());
        };
        Ok(Operator { actor: actor.clone(), can_change: access == Access::Change, csrf: csrf.clone() })
    }
}

/// What the configured token with this digest (hex) may do in the console now: `None` when no
/// such token is configured, it is bound to a tenant, or it has no console scope. A lookup in the
/// configuration, so checking it on every request costs no I/O.
fn current_access(state: &AppState, digest_hex: &str) -> Option<Access> {
    let digest = hex::decode(digest_hex).ok()?;
    let known = state.config.tokens.iter().find(|t| t.digest[..] == digest[..])?;
    let access = access(known.grant);
    (known.tenant.is_none() && access != Access::None).then_some(access)
}

pub(crate) fn unavailable(why: &str) -> Response {
    let body = html::page("Unavailable", None, &html::notice(&format!("Redis is unavailable: {why}"), false));
    (StatusCode::SERVICE_UNAVAILABLE, Html(body)).into_response()
}

/// A refused change: a read-only session, or a form without the session's CSRF token.
pub(crate) fn refused(why: &str) -> Response {
    (StatusCode::FORBIDDEN, Html(html::page("Refused", None, &html::notice(why, false)))).into_response()
}

/// Checks a change form: the session may change things and the form carries its CSRF token.
pub(crate) fn check_change(op: &Operator, form: &HashMap<String, String>) -> Result<(), Response> {
    if !op.can_change {
        return Err(refused("this session is read-only (console:read): it changes nothing"));
    }
    let sent = form.get("csrf").map(String::as_str).unwrap_or_default();
    // Compared as digests, so timing says nothing about the token.
    if Sha256::digest(sent.as_bytes()) != Sha256::digest(op.csrf.as_bytes()) {
        return Err(refused("the form's CSRF token is missing or wrong; reload the page and try again"));
    }
    Ok(())
}

/// A change (a POST form) the console may make: the logged-in operator, whose session may change
/// things, and the form, which carries the session's CSRF token. Any other request is refused with
/// the same page `check_change` answers (a 403), before the handler runs.
pub(crate) struct Change {
    pub op: Operator,
    pub form: HashMap<String, String>,
}

impl FromRequest<AppState> for Change {
    type Rejection = Response;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = request.into_parts();
        let op = Operator::from_request_parts(&mut parts, state).await?;
        let Form(form) = Form::<HashMap<String, String>>::from_request(Request::from_parts(parts, body), state)
            .await
            .map_err(IntoResponse::into_response)?;
        check_change(&op, &form)?;
        Ok(Change { op, form })
    }
}

/// The login form's own CSRF cookie: the form carries the same random value, and a login whose
/// form and cookie differ is refused (a forged cross-site login cannot send a `SameSite=Strict`
/// cookie, so no one can log a browser into a session of theirs).
pub(crate) const LOGIN_COOKIE: &str = "fleet_console_login";
const LOGIN_FORM_TTL_SECS: u64 = 3600;

fn login_cookie(value: &str, max_age: u64, secure: bool) -> String {
    format!(
        "{LOGIN_COOKIE}={value}; Path=/console/login; HttpOnly; SameSite=Strict; Max-Age={max_age}{}",
        if secure { "; Secure" } else { "" }
    )
}

/// The login page, with a fresh form token (and its cookie), answered with `status`.
fn login_page(status: StatusCode, message: Option<&str>, headers: &HeaderMap) -> Response {
    let csrf = random_hex();
    let form = format!(
        "<form method=\"post\" action=\"/console/login\" class=\"login\">\
        <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
        <label>API token <input type=\"password\" name=\"token\" autocomplete=\"off\" autofocus></label>\
        <button class=\"primary\">Log in</button></form>\
        <p class=\"hint\">A full-rights token or one with <code>console:admin</code> may change things; \
        one with <code>console:read</code> only looks.</p>"
    );
    let notice = message.map(|m| html::notice(m, false)).unwrap_or_default();
    let cookie = login_cookie(&csrf, LOGIN_FORM_TTL_SECS, over_tls(headers));
    (status, [(header::SET_COOKIE, cookie)], Html(html::page("Log in", None, &format!("{notice}{form}"))))
        .into_response()
}

pub(crate) async fn login_form(headers: HeaderMap) -> Response {
    login_page(StatusCode::OK, None, &headers)
}

/// Whether a login form came from this console: its token matches the login cookie's.
pub(crate) fn login_form_genuine(headers: &HeaderMap, form: &HashMap<String, String>) -> bool {
    let (Some(cookie), Some(sent)) = (cookie(headers, LOGIN_COOKIE), form.get("csrf")) else { return false };
    // Compared as digests, so timing says nothing about the token.
    cookie.len() == 64 && Sha256::digest(cookie.as_bytes()) == Sha256::digest(sent.as_bytes())
}

/// Checks the form's token and the API token, starts a session, and sends the browser to the
/// overview.
pub(crate) async fn login(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    headers: HeaderMap,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    if !login_form_genuine(&headers, &form) {
        let message = "This login form did not come from this console, or it expired: log in again.";
        return login_page(StatusCode::FORBIDDEN, Some(message), &headers);
    }
    // Counted per peer address: behind a proxy, that is the proxy's (every client shares it).
    let source = peer.ip().to_string();
    match state.store.console().console_login_failures(&source).await {
        Ok(n) if n >= LOGIN_FAILURES_ALLOWED => {
            let message =
                format!("Too many failed logins from this address: try again in {} minutes.", LOGIN_WINDOW_SECS / 60);
            let mut page = login_page(StatusCode::TOO_MANY_REQUESTS, Some(&message), &headers);
            page.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(LOGIN_WINDOW_SECS));
            return page;
        }
        Ok(_) => {}
        Err(e) => return unavailable(&e.to_string()),
    }
    let token = form.get("token").map(|t| t.trim()).unwrap_or_default();
    let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    let Some(known) = state.config.tokens.iter().find(|t| t.digest == digest) else {
        if let Err(e) = state.store.console().console_login_failed(&source, LOGIN_WINDOW_SECS).await {
            return unavailable(&e.to_string());
        }
        return login_page(StatusCode::UNAUTHORIZED, Some("That token is not one this fleet knows."), &headers);
    };
    if let Some(tenant) = &known.tenant {
        let message = format!(
            "That token is bound to a tenant ({tenant}): the console is the operators' and shows every \
            tenant's work. Log in with an operator's token (one not bound to a tenant)."
        );
        return login_page(StatusCode::FORBIDDEN, Some(&message), &headers);
    }
    let access = access(known.grant);
    if access == Access::None {
        let message = "That token has no console scope (console:read or console:admin).";
        return login_page(StatusCode::FORBIDDEN, Some(message), &headers);
    }
    let id = random_hex();
    let actor = format!("token:{}", &hex::encode(digest)[..12]);
    let fields = [("token", hex::encode(digest)), ("actor", actor), ("csrf", random_hex())];
    if let Err(e) = state.store.console().console_session_put(&id, &fields, SESSION_TTL_SECS).await {
        return unavailable(&e.to_string());
    }
    let tls = over_tls(&headers);
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/console".to_string())]).into_response();
    for cookie in [session_cookie(&id, SESSION_TTL_SECS, tls), login_cookie("", 0, tls)] {
        if let Ok(value) = header::HeaderValue::from_str(&cookie) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    response
}

pub(crate) async fn logout(
    State(state): State<AppState>,
    headers: HeaderMap,
    op: Operator,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    let sent = form.get("csrf").map(String::as_str).unwrap_or_default();
    if Sha256::digest(sent.as_bytes()) != Sha256::digest(op.csrf.as_bytes()) {
        return refused("the form's CSRF token is missing or wrong");
    }
    if let Some(id) = cookie(&headers, COOKIE) {
        let _ = state.store.console().console_session_end(id).await;
    }
    let cookie = session_cookie("", 0, over_tls(&headers));
    (StatusCode::SEE_OTHER, [(header::SET_COOKIE, cookie), (header::LOCATION, "/console/login".to_string())])
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_http_only_strict_and_secure_over_tls() {
        let c = session_cookie("abc", 60, true);
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.ends_with("; Secure"));
        assert!(!session_cookie("abc", 60, false).contains("Secure"));
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, "a=1; fleet_console=xyz; b=2".parse().unwrap());
        assert_eq!(cookie(&headers, COOKIE), Some("xyz"));
    }

    #[test]
    fn console_read_looks_and_console_admin_or_full_rights_change() {
        assert_eq!(access(Grant::Full), Access::Change);
        assert_eq!(access(Grant::scoped([Scope::ConsoleRead])), Access::Read);
        assert_eq!(access(Grant::scoped([Scope::ConsoleAdmin])), Access::Change);
        assert_eq!(access(Grant::scoped([Scope::ToolsRead])), Access::None);
        let ro = Operator { actor: "a".into(), can_change: false, csrf: "t".into() };
        let form: HashMap<String, String> = [("csrf".to_string(), "t".to_string())].into();
        assert!(check_change(&ro, &form).is_err());
        let rw = Operator { can_change: true, ..ro };
        assert!(check_change(&rw, &form).is_ok());
        assert!(check_change(&rw, &HashMap::new()).is_err());
    }

    #[test]
    fn a_login_form_is_genuine_only_with_its_cookie_and_the_same_token() {
        let token = "a".repeat(64);
        let form: HashMap<String, String> = [("csrf".to_string(), token.clone())].into();
        let mut headers = HeaderMap::new();
        assert!(!login_form_genuine(&headers, &form), "no cookie: a forged cross-site POST");
        headers.insert(header::COOKIE, format!("{LOGIN_COOKIE}={token}").parse().unwrap());
        assert!(login_form_genuine(&headers, &form));
        assert!(!login_form_genuine(&headers, &HashMap::new()), "no token in the form");
        let other: HashMap<String, String> = [("csrf".to_string(), "b".repeat(64))].into();
        assert!(!login_form_genuine(&headers, &other));
        let c = login_cookie(&token, 60, true);
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.contains("Path=/console/login"));
    }
}
