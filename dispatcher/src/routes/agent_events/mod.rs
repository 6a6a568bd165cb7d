//! Seed 001's session events: `POST /v2/agents/{agent_key}/sessions/{session_key}/events`. An
//! input is a turn of the session (the same submit path as `POST /v1/turns`), a `tool_output`
//! answers a client tool's pending calls, a `compaction` is a turn that summarises the history.
//! The answer is 201 with the events the request's turn produced until it ends or waits for the
//! client, or the same events as SSE with `stream_response`: the request's surface then listens to
//! the session while its stream is open, and an input with `surface_description.include` tells the
//! model which surfaces listen.

mod compaction;
mod input;
mod tool_output;
mod wire;

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use fleet_protocol::agents::AssistantRecord;
use fleet_protocol::surfaces::Surface;

use crate::error::ApiError;
use crate::routes::common::{require_json, Body};
use crate::stream::{Awaited, Follow, Listening, StreamId, Window};
use crate::{validate, AppState};
use wire::{AgentEvent, SurfaceDescription};

pub(crate) use wire::SessionInput;

/// How long a 201 answer waits for its turn when the request names no `Request-Timeout`.
const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// The longest wait a request may ask for.
const MAX_WAIT: Duration = Duration::from_secs(3600);

/// What a request started: the session's feed (joined before it appended anything), where its
/// answer starts, and whose end it waits for.
pub(super) struct Started {
    subscription: crate::stream::Subscription,
    after: StreamId,
    ends_after: StreamId,
    awaited: Awaited,
}

/// Creates an input event: 201 with the events it produced, or SSE with `stream_response`.
#[utoipa::path(post, path = "/v2/agents/{agent_key}/sessions/{session_key}/events", extensions(("x-tenancy" = json!("resource"))), tag = "agent-sessions",
    security(("bearer" = ["turns:write"])),
    params(("agent_key" = String, Path, description = "The agent: an assistant's id (`asst_…`) or name"),
        ("session_key" = String, Path, description = "The session (a room's id, or any key: the first input makes it the agent's session)"),
        ("Request-Timeout" = Option<u64>, Header, description = "Seconds the 201 answer waits for the turn (default 300, at most 3600)"),
        ("Request-Timeout-Millis" = Option<u64>, Header, description = "The same in milliseconds")),
    request_body = SessionInput,
    responses((status = 201, description = "The input was created; the events it produced (`text/event-stream` with `stream_response`)", body = AgentResponse),
        (status = 400, description = "The request is malformed (the message names the field)", body = crate::routes::docs::ErrorBody),
        (status = 404, description = "No such agent, or the session is another agent's", body = crate::routes::docs::ErrorBody),
        (status = 409, description = "The session is already running (give `behavior` or `since`), the room is closed, or the tool call was answered", body = crate::routes::docs::ErrorBody),
        (status = 422, description = "The agent's configuration is invalid (an enabled tool is not registered)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn create_event(
    State(state): State<AppState>,
    tenancy: crate::tenancy::Tenancy,
    Path((agent_key, session_key)): Path<(String, String)>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<Response, ApiError> {
    require_json(&headers)?;
    let request: SessionInput = validate::parse_body(&body).map_err(as_bad_request)?;
    request.surface().map(SurfaceDescription::check).transpose().map_err(bad_request)?;
    validate::identifier("session_key", Some(&session_key)).map_err(as_bad_request)?;
    // From here on the session as stored: a bound caller's key is its tenant's own session.
    let session_key = tenancy.session(&session_key);
    let wait = request_timeout(&headers)?;
    let agent = agent(&state, tenancy.bound.as_deref(), &agent_key).await?;
    own_session(&state, &tenancy, &agent, &session_key).await?;
    let started = match &request {
        SessionInput::Input(input) => input::submit(&state, &agent, &session_key, input, &headers, &tenancy).await?,
        SessionInput::ToolOutput(outputs) => tool_output::submit(&state, &session_key, outputs).await?,
        SessionInput::Compaction(c) => {
            compaction::submit(&state, &agent, &session_key, c, &headers, tenancy.resolve(None)?).await?
        }
    };
    let window = Window { after: started.after, ends_after: started.ends_after };
    let follow = Follow::new(
        state.streams.clone(),
        state.store.clone(),
        session_key.clone(),
        started.subscription,
        window,
        started.awaited,
        state.config.secrets_key.clone(),
    );
    Ok(if request.stream_response() {
        let headers = [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (header::HeaderName::from_static("x-accel-buffering"), HeaderValue::from_static("no")),
        ];
        // A streaming request's surface listens to the session for as long as its stream is open.
        let surface =
            request.surface().map(SurfaceDescription::surface).unwrap_or_else(|| Surface::described(None, None));
        let listening = Listening::open(state.streams.clone(), state.store.clone(), &session_key, &surface).await;
        (StatusCode::CREATED, headers, follow.into_sse(Some(listening))).into_response()
    } else {
        let events = follow.gather(wait).await;
        (StatusCode::CREATED, Json(AgentResponse { events })).into_response()
    })
}

/// Seed 001's answer: the events the input produced, until its turn ended or waits for the
/// client's tool outputs.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AgentResponse {
    /// Each as the session's stream carries it.
    #[schema(value_type = Vec<AgentEvent>)]
    events: Vec<Value>,
}

/// The agent a key names, as a caller bound to `bound` sees it: an assistant's id, else its name
/// (the tenant's own assistant of that name, else the operators'); another tenant's is none.
pub(crate) async fn agent(state: &AppState, bound: Option<&str>, key: &str) -> Result<AssistantRecord, ApiError> {
    let found = if fleet_protocol::agents::is_id("asst_", key) {
        state.store.registry().get_assistant(key).await?
    } else {
        state.store.registry().assistant_by_name(bound, key).await?
    };
    let found = found.filter(|a| a.seen_by(bound));
    found.ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "agent_not_found", format!("no agent {key:?}")))
}

/// A session belongs to one agent: a room to its assistant (and a closed room takes no input),
/// any other key to the agent that used it first. A bound token's inputs, tool outputs and
/// compactions touch only its own tenant's sessions: the tenant and the agent are claimed in one
/// write, so a request refused for either binds neither.
pub(crate) async fn own_session(
    state: &AppState,
    tenancy: &crate::tenancy::Tenancy,
    agent: &AssistantRecord,
    session: &str,
) -> Result<(), ApiError> {
    let other = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "session_not_found",
            format!("session {session:?} is not a session of agent {:?}", agent.name),
        )
    };
    if let Some(room) = state.store.registry().get_room(session).await? {
        crate::routes::common::check_session(state, tenancy, session).await?;
        if room.assistant_id != agent.id {
            return Err(other());
        }
        if room.status == fleet_protocol::agents::RoomStatus::Closed {
            return Err(crate::routes::closing::closed(session));
        }
        return Ok(());
    }
    let holders = state.store.sessions().claim_session(session, tenancy.bound.as_deref(), Some(&agent.id)).await?;
    if !tenancy.sees(holders.tenant.as_deref()) {
        return Err(ApiError::not_found(format!("no session {session:?}")));
    }
    if holders.agent.as_deref() != Some(agent.id.as_str()) {
        return Err(other());
    }
    Ok(())
}

/// Whether the session is the agent's: a room's assistant, else the agent it is bound to.
pub(crate) async fn agents_session(state: &AppState, agent: &AssistantRecord, session: &str) -> Result<bool, ApiError> {
    if let Some(room) = state.store.registry().get_room(session).await? {
        return Ok(room.assistant_id == agent.id);
    }
    Ok(state.store.sessions().session_agent(session).await?.as_deref() == Some(agent.id.as_str()))
}

/// A session of an agent, as seed 001 shows it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AgentSession {
    session_key: String,
    /// The agent's name.
    agent_key: String,
    /// The step the session is in: where its next input starts unless it names an `entry_step`
    /// (null for an agent without steps, or a session that has not run yet).
    current_step_name: Option<String>,
    /// Whether a turn runs in it or waits in its line.
    running: bool,
}

/// A session of the agent: its current step, and whether it runs.
#[utoipa::path(get, path = "/v2/agents/{agent_key}/sessions/{session_key}", extensions(("x-tenancy" = json!("resource"))), tag = "agent-sessions",
    security(("bearer" = ["sessions:read"])),
    params(("agent_key" = String, Path, description = "The agent: an assistant's id (`asst_…`) or name"),
        ("session_key" = String, Path, description = "The session")),
    responses((status = 200, description = "The session", body = AgentSession),
        (status = 404, description = "No such agent or session (or another tenant's)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn get_session(
    State(state): State<AppState>,
    tenancy: crate::tenancy::Tenancy,
    Path((agent_key, session_key)): Path<(String, String)>,
) -> Result<Json<AgentSession>, ApiError> {
    validate::identifier("session_key", Some(&session_key)).map_err(as_bad_request)?;
    let session = tenancy.session(&session_key);
    let agent = agent(&state, tenancy.bound.as_deref(), &agent_key).await?;
    crate::routes::common::check_session(&state, &tenancy, &session).await?;
    if !agents_session(&state, &agent, &session).await? {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "session_not_found",
            format!("no session {session_key:?} of agent {:?}", agent.name),
        ));
    }
    let sessions = state.store.sessions();
    let (step, running) = tokio::try_join!(sessions.session_step(&session), sessions.session_busy(&session))?;
    let current_step_name =
        step.filter(|s| agent.agent.steps.contains_key(s)).or_else(|| agent.agent.first_step_name.clone());
    Ok(Json(AgentSession { session_key, agent_key: agent.name, current_step_name, running }))
}

/// `Request-Timeout` (seconds) or `Request-Timeout-Millis`: how long a 201 answer waits.
fn request_timeout(headers: &HeaderMap) -> Result<Duration, ApiError> {
    let read = |name: &str| -> Result<Option<u64>, ApiError> {
        let Some(v) = headers.get(name) else { return Ok(None) };
        v.to_str().ok().and_then(|s| s.trim().parse().ok()).map(Some).ok_or_else(|| {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", format!("{name} must be a whole number"))
        })
    };
    let wait = match (read("request-timeout-millis")?, read("request-timeout")?) {
        (Some(ms), _) => Duration::from_millis(ms),
        (None, Some(s)) => Duration::from_secs(s),
        (None, None) => DEFAULT_WAIT,
    };
    Ok(wait.min(MAX_WAIT))
}

/// Seed 001 answers a malformed request with 400 (the fleet's other routes say 422 for a body
/// that parses but does not fit).
fn as_bad_request(e: ApiError) -> ApiError {
    if e.status == StatusCode::UNPROCESSABLE_ENTITY {
        ApiError { status: StatusCode::BAD_REQUEST, ..e }
    } else {
        e
    }
}

pub(super) fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
}

/// This module's routes, each with its OpenAPI operation (path, method, scope): adding a route
/// here is all it takes to serve, document and guard it.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(create_event))
        .routes(utoipa_axum::routes!(get_session))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_comes_from_either_header_and_is_bounded() {
        let mut h = HeaderMap::new();
        assert_eq!(request_timeout(&h).unwrap(), DEFAULT_WAIT);
        h.insert("request-timeout", HeaderValue::from_static("7"));
        assert_eq!(request_timeout(&h).unwrap(), Duration::from_secs(7));
        h.insert("request-timeout-millis", HeaderValue::from_static("1500"));
        assert_eq!(request_timeout(&h).unwrap(), Duration::from_millis(1500), "millis win");
        h.insert("request-timeout-millis", HeaderValue::from_static("99999999"));
        assert_eq!(request_timeout(&h).unwrap(), MAX_WAIT);
        h.insert("request-timeout-millis", HeaderValue::from_static("soon"));
        assert_eq!(request_timeout(&h).unwrap_err().status, StatusCode::BAD_REQUEST);
    }
}
