//! A seed 001 input: a turn of the session with the agent as its assistant, accepted through the
//! same submit path as `POST /v1/turns`. A running session refuses it (409) unless it says how to
//! queue (`behavior`) or asks for the events since a cursor (`since`). Its `input_message` event
//! is appended before its job is published, so the turn's events always come after it. With
//! `surface_description.include`, its first message tells the model which surfaces listen.

use axum::http::{HeaderMap, StatusCode};

use fleet_protocol::agent_session::stream_id_of;
use fleet_protocol::agents::AssistantRecord;
use fleet_protocol::surfaces;
use fleet_protocol::turn::{Behavior, TurnInput};

use super::wire::{InputBehavior, InputRequest, Since};
use super::{bad_request, Started};
use crate::error::ApiError;
use crate::routes::submit::submit_job;
use crate::routes::turns::{check_turn, NewTurn};
use crate::stream::{Awaited, StreamId};
use crate::AppState;

const ROUTE: &str = "POST /v2/agents/{agent_key}/sessions/{session_key}/events";

pub(super) async fn submit(
    state: &AppState,
    agent: &AssistantRecord,
    session: &str,
    request: &InputRequest,
    headers: &HeaderMap,
    tenancy: &crate::tenancy::Tenancy,
) -> Result<Started, ApiError> {
    let parts = request.parts(&agent.agent).map_err(bad_request)?;
    let since = request.since().map_err(bad_request)?;
    if request.behavior.is_none() && since.is_none() && state.store.sessions().session_busy(session).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "session_running",
            "the session is already running: give `behavior` (steer or follow_up) or `since` to queue this input",
        ));
    }
    let behavior = match request.behavior {
        Some(InputBehavior::Steer) => Behavior::Steer,
        Some(InputBehavior::FollowUp) | None => Behavior::FollowUp,
    };
    let mut input = TurnInput {
        // As the client named it: `check_turn` applies the caller's tenancy again.
        session_id: fleet_protocol::tenant::session_key_shown(session).to_string(),
        assistant: agent.snapshot(),
        messages: surfaces::input_messages(&parts, listeners_note(state, session, request).await?.as_deref()),
        behavior,
        tenant: None,
        priority: Default::default(),
        agent: agent.agent_turn(request.entry_step.clone()),
    };
    check_turn(state, tenancy, &mut input, "the agent's enabled_tools").await?;
    let surface = request.surface_description.as_ref().map(|s| serde_json::to_value(s).unwrap_or_default());
    // Joined before anything is appended: no event of the turn can be missed.
    let subscription = state.streams.join(session).await?;
    let (turn, announced) = NewTurn::new(input, String::new(), ROUTE).announcing(parts, surface);
    let accepted = submit_job(state, None, headers, turn).await?;
    let own = announced.get().and_then(|id| StreamId::parse(id)).unwrap_or(StreamId::ZERO);
    let after = match since {
        None => own.before(),
        Some(Since::Start) => StreamId::ZERO,
        Some(Since::After(id)) => stream_id_of(&id).and_then(StreamId::parse).unwrap_or(StreamId::ZERO),
    };
    let steered_from = (behavior == Behavior::Steer).then(|| accepted.execution_id.clone());
    let awaited = Awaited { turns: vec![accepted.execution_id], steered_from };
    Ok(Started { subscription, after, ends_after: own.before(), awaited })
}

/// What the model is told of the session's listeners, if the input asks (`include`): read as the
/// input is sent, its own surface counted when its answer streams.
async fn listeners_note(state: &AppState, session: &str, request: &InputRequest) -> Result<Option<String>, ApiError> {
    let Some(described) = request.surface_description.as_ref().filter(|s| s.include()) else { return Ok(None) };
    let entries = state.store.sessions().listeners(session).await?;
    let own = request.stream_response.then(|| described.surface());
    Ok(Some(surfaces::listeners_note(&surfaces::listening(&entries, own))))
}
