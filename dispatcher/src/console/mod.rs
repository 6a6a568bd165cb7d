//! The operator console at `/console`: server-rendered HTML (every value escaped, `html.rs`) over
//! the same store and operations as the API, behind a login session (`session.rs`). No Node build:
//! the pages work without script; one small embedded script (`console.js`, `include_str!`) only
//! follows a session's live stream. Every change is a POST with the session's CSRF token, refused
//! for a read-only session, and written to the audit log.

// A refused form's page is the handler's answer as it is: checks return the `Response` itself.
#![allow(clippy::result_large_err)]

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
use axum::routing::{get, post};
use axum::Router;

use fleet_platform::audit::AuditEvent;

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

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/console", get(pages::overview))
        .route("/console/login", get(session::login_form).post(session::login))
        .route("/console/logout", post(session::logout))
        .route("/console/dead-letters", get(dead_letters::list))
        .route("/console/dead-letters/redrive/preview", post(bulk::redrive_preview))
        .route("/console/dead-letters/redrive", post(bulk::redrive))
        .route("/console/dead-letters/purge/preview", post(bulk::purge_preview))
        .route("/console/dead-letters/purge", post(bulk::purge))
        .route("/console/dead-letters/{id}", get(dead_letters::detail))
        .route("/console/dead-letters/{id}/retry", post(dead_letters::retry))
        .route("/console/dead-letters/{id}/retry-edited", post(dead_letters::retry_edited))
        .route("/console/dead-letters/{id}/delete", post(dead_letters::delete))
        .route("/console/jobs/{id}", get(bulk::job))
        .route("/console/executions", get(pages::executions))
        .route("/console/executions/{id}", get(pages::execution))
        .route("/console/executions/{id}/cancel", post(pages::cancel))
        .route("/console/tools", get(pages::tools))
        .route("/console/tools/{name}/close-circuit", post(pages::close_circuit))
        .route("/console/webhooks", get(webhooks::page))
        .route("/console/sessions", get(pages::sessions))
        .route("/console/sessions/{id}/forget", post(pages::forget))
        .route("/console/audit", get(pages::audit))
        .route(
            "/console/static/console.js",
            get(|| async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SCRIPT) }),
        )
        .route(
            "/console/static/console.css",
            get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE) }),
        )
        .layer(middleware::from_fn(guard_headers))
        .with_state(state)
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
