//! The operator console at `/console`: server-rendered HTML (every value escaped, `html.rs`) over
//! the same store and operations as the API, behind a login session (`session.rs`). No Node build:
//! the pages work without script; one small embedded script (`console.js`, `include_str!`) only
//! follows a session's live stream. Every change is a POST with the session's CSRF token, refused
//! for a read-only session, and written to the audit log.

// A refused form's page is the handler's answer as it is: checks return the `Response` itself.
#![allow(clippy::result_large_err)]

mod approvals;
mod bulk;
pub(crate) mod dead_letters;
pub(crate) mod html;
pub(crate) mod pages;
pub(crate) mod session;
mod webhooks;

use std::collections::HashMap;

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Router;

use fleet_platform::store::AuditEvent;

use crate::AppState;

/// A query string's or form's fields.
pub(crate) type Params = HashMap<String, String>;

/// A page with a notice (what an action did, or why it did nothing) and a link on from it.
fn notice_page(viewer: &html::Viewer<'_>, title: &str, text: &str, ok: bool, link: &str) -> Html<String> {
    Html(html::page(title, Some(viewer), &format!("{}<p>{link}</p>", html::notice(text, ok))))
}

/// A page saying what went wrong (422: the request named something the console cannot do).
pub(crate) fn fail(viewer: &html::Viewer<'_>, title: &str, why: &str) -> Response {
    let back = html::link("/console", "← Overview");
    (StatusCode::UNPROCESSABLE_ENTITY, notice_page(viewer, title, why, false, &back)).into_response()
}

/// A change's outcome page (200): `text` as a good or a bad notice, and `link` on from it.
pub(crate) fn outcome(viewer: &html::Viewer<'_>, title: &str, text: &str, ok: bool, link: &str) -> Response {
    notice_page(viewer, title, text, ok, link).into_response()
}

/// Writes a change the console made to the audit log, as `actor`'s.
pub(crate) async fn audit(
    state: &AppState,
    actor: &str,
    action: &str,
    target: &str,
    count: u64,
    detail: Option<&serde_json::Value>,
) {
    let event = AuditEvent { actor, via: "console", action, target, count, detail };
    crate::routes::audit::record(state, event).await;
}

const SCRIPT: &str = include_str!("console.js");
const STYLE: &str = include_str!("console.css");

/// Who may use a console route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsoleAccess {
    /// No session needed: the login form and the console's script and style.
    Public,
    /// A page: an operator's session (any console scope).
    Page,
    /// A change (a POST): a session that may change things and its CSRF token.
    Change,
    /// A POST any session may make with its CSRF token: logging out.
    Session,
}

/// One console route: the method, the path template and who may use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsoleRoute {
    pub method: &'static str,
    pub path: &'static str,
    pub access: ConsoleAccess,
}

/// Every console route, declared once: the router is built from this list and the walk test
/// (`tests/tests/fleet/tenant_walk.rs`) visits each entry, so a page added here is walked.
fn declared() -> Vec<(ConsoleRoute, MethodRouter<AppState>)> {
    use ConsoleAccess::{Change as C, Page as P, Public as O, Session as S};
    let r = |method, path, access, handler| (ConsoleRoute { method, path, access }, handler);
    let script = || async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SCRIPT) };
    let style = || async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE) };
    vec![
        r("GET", "/console", P, get(pages::overview)),
        r("GET", "/console/login", O, get(session::login_form)),
        r("POST", "/console/login", O, post(session::login)),
        r("POST", "/console/logout", S, post(session::logout)),
        r("GET", "/console/dead-letters", P, get(dead_letters::list)),
        r("POST", "/console/dead-letters/redrive/preview", C, post(bulk::redrive_preview)),
        r("POST", "/console/dead-letters/redrive", C, post(bulk::redrive)),
        r("POST", "/console/dead-letters/purge/preview", C, post(bulk::purge_preview)),
        r("POST", "/console/dead-letters/purge", C, post(bulk::purge)),
        r("GET", "/console/dead-letters/{id}", P, get(dead_letters::detail)),
        r("POST", "/console/dead-letters/{id}/retry", C, post(dead_letters::retry)),
        r("POST", "/console/dead-letters/{id}/retry-edited", C, post(dead_letters::retry_edited)),
        r("POST", "/console/dead-letters/{id}/delete", C, post(dead_letters::delete)),
        r("GET", "/console/jobs/{id}", P, get(bulk::job)),
        r("GET", "/console/executions", P, get(pages::executions)),
        r("GET", "/console/executions/{id}", P, get(pages::execution)),
        r("POST", "/console/executions/{id}/cancel", C, post(pages::cancel)),
        r("GET", "/console/tools", P, get(pages::tools)),
        r("POST", "/console/tools/{name}/close-circuit", C, post(pages::close_circuit)),
        r("GET", "/console/webhooks", P, get(webhooks::page)),
        r("GET", "/console/sessions", P, get(pages::sessions)),
        r("POST", "/console/sessions/{id}/forget", C, post(pages::forget)),
        r("GET", "/console/approvals", P, get(approvals::page)),
        r("POST", "/console/approvals/{id}/approve", C, post(approvals::approve)),
        r("POST", "/console/approvals/{id}/deny", C, post(approvals::deny)),
        r("GET", "/console/audit", P, get(pages::audit)),
        r("GET", "/console/static/console.js", O, get(script)),
        r("GET", "/console/static/console.css", O, get(style)),
    ]
}

/// The console's routes as declared (for the walk test and the docs).
pub fn routes() -> Vec<ConsoleRoute> {
    declared().into_iter().map(|(route, _)| route).collect()
}

pub(crate) fn router(state: AppState) -> Router {
    let mut router = Router::new();
    for (route, handler) in declared() {
        router = router.route(route.path, handler);
    }
    router.layer(middleware::from_fn(guard_headers)).with_state(state)
}

/// Headers on every console answer: no script but the console's own (CSP), no framing, no
/// caching of pages that show operational data, no sniffing.
async fn guard_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}
