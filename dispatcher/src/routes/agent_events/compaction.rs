//! A seed 001 compaction: a turn of the session (in its line, under its lock, through the same
//! submit path as every turn) whose step summarises the oldest exchanges of the remembered history
//! with the session's model instead of answering. A running session refuses it (409); an anchor
//! (`compact_up_to_event_id`) must be an event of one of the session's turns.

use axum::http::{HeaderMap, StatusCode};

use fleet_platform::now_ms;
use fleet_protocol::agent_session::{stream_id_of, turn_of};
use fleet_protocol::agents::AssistantRecord;
use fleet_protocol::compaction::{Compaction, DEFAULT_KEEP_RECENT_INPUTS};
use fleet_protocol::envelope::{Envelope, Job, TurnJob};
use fleet_protocol::turn::{self, Behavior, TurnInput, TurnState};

use super::wire::CompactionRequest;
use super::{bad_request, Started};
use crate::error::ApiError;
use crate::routes::submit::{submit_job, Recording, Submission};
use crate::routes::turns::record_turn;
use crate::stream::{Awaited, StreamId};
use crate::AppState;

pub(super) async fn submit(
    state: &AppState,
    agent: &AssistantRecord,
    session: &str,
    request: &CompactionRequest,
    headers: &HeaderMap,
    tenant: String,
) -> Result<Started, ApiError> {
    request.check().map_err(bad_request)?;
    if state.store.sessions().session_busy(session).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "session_running",
            "the session is already running; compact it once its turns have ended",
        ));
    }
    let up_to_turn = match &request.compact_up_to_event_id {
        None => None,
        Some(id) => Some(anchor_turn(state, session, id).await?),
    };
    let compaction = Compaction {
        up_to_turn,
        prompt: request.compaction_message.clone(),
        keep_recent: DEFAULT_KEEP_RECENT_INPUTS,
        done: None,
    };
    let subscription = state.streams.join(session).await?;
    let before = StreamId::parse(&state.store.sessions().last_event_id(session).await?).unwrap_or(StreamId::ZERO);
    let job = NewCompaction { session: session.to_string(), agent: agent.snapshot(), compaction, tenant: Some(tenant) };
    let accepted = submit_job(state, None, headers, job).await?;
    let awaited = Awaited { turns: vec![accepted.execution_id], steered_from: None };
    Ok(Started { subscription, after: before, ends_after: before, awaited })
}

/// The turn an anchor event belongs to.
async fn anchor_turn(state: &AppState, session: &str, event_id: &str) -> Result<String, ApiError> {
    let unknown =
        || bad_request(format!("compact_up_to_event_id {event_id:?} names no event this session still keeps"));
    let stream_id = stream_id_of(event_id).ok_or_else(unknown)?;
    let event = state.store.sessions().read_event(session, stream_id).await?.ok_or_else(unknown)?;
    turn_of(&event).ok_or_else(|| bad_request(format!("compact_up_to_event_id {event_id:?} is not an event of a turn")))
}

/// A compaction as submitted.
struct NewCompaction {
    session: String,
    agent: turn::Assistant,
    compaction: Compaction,
    tenant: Option<String>,
}

impl Submission for NewCompaction {
    fn body_digest(&self) -> String {
        String::new()
    }

    fn span(&self, execution_id: &str) -> tracing::Span {
        tracing::info_span!("compaction", otel.name = "compaction", otel.kind = "server", execution_id = %execution_id)
    }

    async fn record(&self, state: &AppState, execution_id: &str, recording: Recording) -> Result<Envelope, ApiError> {
        let input = TurnInput {
            session_id: self.session.clone(),
            assistant: self.agent.clone(),
            messages: vec![],
            behavior: Behavior::FollowUp,
            tenant: self.tenant.clone(),
            priority: Default::default(),
            agent: None,
        };
        let mut turn = TurnState::new(&input, turn::model_call_message_id(execution_id, 0));
        turn.conversation.clear();
        turn.compaction = Some(self.compaction.clone());
        record_turn(state, execution_id, &turn, recording).await?;
        let job = Job::Turn(TurnJob { session_id: self.session.clone(), round: 0 });
        Ok(Envelope::new(execution_id.to_string(), job, now_ms()))
    }

    async fn undo(&self, state: &AppState, execution_id: &str, _recorded: bool) {
        let _ = state.store.sessions().session_dequeue(&self.session, execution_id).await;
        let _ = state.store.executions().delete_execution(execution_id).await;
    }
}
