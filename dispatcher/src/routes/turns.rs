//! `POST /v1/turns`, and a turn's part of `GET /v1/executions/{id}`.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use std::sync::{Arc, OnceLock};

use serde::Serialize;
use serde_json::Value;

use sha2::{Digest, Sha256};

use fleet_platform::now_ms;
use fleet_platform::store::NewExecution;
use fleet_protocol::agent_session;
use fleet_protocol::envelope::{Envelope, Job, JobKind, TurnJob};
use fleet_protocol::turn::{self, TurnInput, TurnState};

use crate::error::ApiError;
use crate::routes::common::{JsonInput, RequestKey, Tenancy};
use crate::routes::submit::{submit, Recording, Submission};
use crate::AppState;

/// Records the turn, puts it in its session's line (arrival order is run order), and publishes its
/// first step with a publisher confirm before answering 202; `Idempotency-Key` is honoured as on
/// `POST /v1/tool-calls` (the same `submit`).
#[utoipa::path(post, path = "/v1/turns", extensions(("x-tenancy" = json!("own"))), tag = "turns", security(("bearer" = ["turns:write"])),
    params(("Idempotency-Key" = Option<String>, Header, description = "1-255 visible ASCII characters; as on POST /v1/tool-calls")),
    request_body = fleet_protocol::turn::TurnInput,
    responses((status = 202, description = "Accepted: the broker confirmed the turn's first step", body = crate::wire::Data<crate::routes::submit::AcceptedJob>,
            headers(("idempotent-replayed" = String, description = "`true` when the answer replays an earlier request's"))),
        (status = 409, description = "A request with this key is still being accepted (`request_in_progress`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn create_turn(
    State(state): State<AppState>,
    tenancy: Tenancy,
    RequestKey(idempotency_key): RequestKey,
    headers: HeaderMap,
    JsonInput { value: mut input, raw }: JsonInput<TurnInput>,
) -> Result<Response, ApiError> {
    check_turn(&state, &tenancy, &mut input, "assistant.enabled_tools").await?;
    let canonical: Value = serde_json::from_slice(&raw).map_err(|e| ApiError::malformed(e.to_string()))?;
    let turn = NewTurn::new(input, turn_digest(&canonical), "POST /v1/turns");
    submit(&state, idempotency_key, &headers, turn).await
}

/// Completes and checks a turn before it is accepted: the defaults are applied here, before the
/// turn is stored, so its state says which provider, model and temperature run it whatever the
/// worker's settings; every enabled tool must be registered (422 naming those that are not, in
/// `tools_field`); its tenant is the caller's (`Tenancy::resolve`).
pub(crate) async fn check_turn(
    state: &AppState,
    tenancy: &Tenancy,
    input: &mut TurnInput,
    tools_field: &str,
) -> Result<(), ApiError> {
    let tenant = tenancy.resolve(input.tenant.as_deref())?;
    let routing = &state.config.common.llm;
    input.apply_defaults(&routing.default_provider, &routing.default_model);
    input.validate().map_err(ApiError::invalid)?;
    // A bound caller's session key names its tenant's own session (validated first: the stored id
    // holds the scope's separator, which no key may).
    input.session_id = tenancy.session(&input.session_id);
    input.tenant = Some(tenant);
    input.check_provider(&routing.names()).map_err(ApiError::invalid)?;
    crate::routes::tools::require_registered(state, tools_field, &input.assistant.enabled_tools).await?;
    crate::routes::webhooks::require_output_sink(state, input.assistant.output_sink.as_deref()).await?;
    // A room is a session: a closed one takes no turn, whichever route sends it.
    if fleet_protocol::agents::is_id("room_", &input.session_id) {
        let room = state.store.registry().get_room(&input.session_id).await?;
        if room.is_some_and(|r| r.status == fleet_protocol::agents::RoomStatus::Closed) {
            return Err(crate::routes::closing::closed(&input.session_id));
        }
    }
    let tenant = input.tenant.as_deref().unwrap_or_default();
    crate::routes::common::claim_session(state, tenancy, &input.session_id, tenant).await
}

/// A turn as submitted: the checked input, what its `Idempotency-Key` compares, the route it
/// came by, and when its messages were sent.
pub(crate) struct NewTurn {
    input: TurnInput,
    digest: String,
    route: &'static str,
    sent_at_ms: i64,
    announce: Option<Announcement>,
}

/// A seed 001 input's `input_message` event (and its skills' `skill_load` events), appended with
/// the turn's record (before its job is published, so every event of the turn comes after it);
/// the input event's stream id once appended.
struct Announcement {
    parts: Vec<agent_session::InputPart>,
    surface: Option<Value>,
    appended: Arc<OnceLock<String>>,
}

impl NewTurn {
    /// `digest` is what the request asks for, distinct across routes (`turn_digest`).
    pub(crate) fn new(input: TurnInput, digest: String, route: &'static str) -> Self {
        NewTurn { input, digest, route, sent_at_ms: now_ms(), announce: None }
    }

    /// The turn appends its input's `input_message` event (seed 001) when it is recorded; the
    /// event's stream id can be read once the turn is accepted.
    pub(crate) fn announcing(
        mut self,
        parts: Vec<agent_session::InputPart>,
        surface: Option<Value>,
    ) -> (Self, Arc<OnceLock<String>>) {
        let appended = Arc::new(OnceLock::new());
        self.announce = Some(Announcement { parts, surface, appended: appended.clone() });
        (self, appended)
    }

    async fn append_input_event(&self, state: &AppState, execution_id: &str) -> Result<(), ApiError> {
        let Some(announce) = &self.announce else { return Ok(()) };
        let events = agent_session::input_events(execution_id, &announce.parts, announce.surface.as_ref());
        let events: Vec<Value> =
            events.into_iter().map(|e| turn::with_base_fields(e, &self.input.session_id, self.sent_at_ms)).collect();
        let ids = state.store.sessions().publish_events(&self.input.session_id, &events).await?;
        if let Some(first) = ids.into_iter().next() {
            let _ = announce.appended.set(first);
        }
        Ok(())
    }

    /// When its messages were sent (ms): their `created_at`.
    pub(crate) fn sent_at_ms(&self) -> i64 {
        self.sent_at_ms
    }

    /// The message-log entries of the turn's input messages, as `execution_id` sent them.
    pub(crate) fn sent_entries(&self, execution_id: &str) -> Vec<fleet_protocol::history::HistoryEntry> {
        let messages: Vec<(String, String)> =
            self.input.messages.iter().map(|m| (m.role.clone(), m.content.clone())).collect();
        fleet_protocol::history::sent_entries(
            execution_id,
            &messages,
            &fleet_protocol::timefmt::rfc3339_from_millis(self.sent_at_ms),
        )
    }
}

impl Submission for NewTurn {
    fn body_digest(&self) -> String {
        self.digest.clone()
    }

    fn span(&self, execution_id: &str) -> tracing::Span {
        tracing::info_span!("turn", otel.name = self.route, otel.kind = "server", execution_id = %execution_id)
    }

    async fn record(&self, state: &AppState, execution_id: &str, recording: Recording) -> Result<Envelope, ApiError> {
        let input = &self.input;
        // Under a key the line entry is made before the record (`record_turn`), so a republish that
        // finds the record knows the entry was made: the turn may have taken it (started) since,
        // and it is not put back.
        if !(recording.republish() && state.store.executions().get_execution(execution_id).await?.is_some()) {
            let turn = TurnState::new(input, turn::model_call_message_id(execution_id, 0));
            // The session's message log shows what was sent when it was sent (once per message).
            let logged = async {
                for entry in self.sent_entries(execution_id) {
                    state.store.sessions().log_message(&input.session_id, &entry).await?;
                }
                Ok::<_, ApiError>(())
            };
            // Apart from the line entry before the record under a key (`record_turn`), these wait
            // for nothing of each other: all are in place before the job is published, and a
            // failure undoes each of them.
            let (recorded, logged, announced) = tokio::join!(
                record_turn(state, execution_id, &turn, recording),
                logged,
                self.append_input_event(state, execution_id)
            );
            recorded.and(logged).and(announced)?;
        }
        let job = Job::Turn(TurnJob { session_id: input.session_id.clone(), round: 0 });
        Ok(Envelope::new(execution_id.to_string(), job, now_ms()))
    }

    fn lane(&self) -> Option<(JobKind, &str, fleet_protocol::fair::Priority)> {
        Some((JobKind::Turn, self.input.tenant.as_deref().unwrap_or_default(), self.input.priority))
    }

    async fn undo(&self, state: &AppState, execution_id: &str, _recorded: bool) {
        // A line entry without a job would hold up every later turn of the session.
        let _ = state.store.sessions().session_dequeue(&self.input.session_id, execution_id).await;
        for entry in self.sent_entries(execution_id) {
            let _ = state.store.sessions().unlog_message(&self.input.session_id, &entry.id).await;
        }
        if let Some(id) = self.announce.as_ref().and_then(|a| a.appended.get()) {
            let _ = state.store.sessions().delete_event(&self.input.session_id, id).await;
        }
        let _ = state.store.executions().delete_execution(execution_id).await;
    }
}

/// Puts a new turn in its session's line and writes its record and state (in one write, and only
/// if there is none yet). Nothing was published without a record, so nothing has run: one line
/// entry, kept or made. Under an `Idempotency-Key` the entry is made first, so that a republish
/// that finds the record knows it was made; without a key no other request records the turn, and
/// the two writes (on two slots) go out together.
pub(crate) async fn record_turn(
    state: &AppState,
    execution_id: &str,
    turn: &TurnState,
    recording: Recording,
) -> Result<(), ApiError> {
    let record = NewExecution {
        execution_id,
        kind: JobKind::Turn,
        tool_name: None,
        room_id: Some(&turn.session_id),
        assistant_id: Some(&turn.assistant.id),
        tenant: turn.tenant.as_deref(),
        now_ms: now_ms(),
        run_at_ms: None,
    };
    let enter = state.store.sessions().session_enqueue(&turn.session_id, execution_id);
    let create = state.store.executions().create_execution(&record, Some(turn));
    if recording == Recording::Once {
        let (entered, created) = tokio::join!(enter, create);
        entered?;
        created?;
    } else {
        enter.await?;
        create.await?;
    }
    Ok(())
}

/// What a turn request asks for: its JSON with keys sorted and spacing dropped, apart from tool
/// calls' (a key sent to both routes is refused as reused, never replayed across them).
fn turn_digest(canonical: &Value) -> String {
    digest("turn", canonical)
}

/// A request's digest for its `Idempotency-Key`: the route's `kind` and the request as JSON (keys
/// sorted, spacing dropped), so one key never replays across routes.
pub(crate) fn digest(kind: &str, canonical: &Value) -> String {
    let mut hasher = Sha256::new();
    hasher.update(kind.as_bytes());
    hasher.update(b"\n");
    hasher.update(serde_json::to_vec(canonical).expect("JSON serialises"));
    hex::encode(hasher.finalize())
}

/// The turn's part of `GET /v1/executions/{id}`: model config, rounds, tool calls, final message.
#[derive(Debug, Serialize)]
pub(crate) struct TurnSummary {
    session_id: String,
    message_id: String,
    /// The provider, model and temperature the turn runs with, its defaults applied.
    model_config: fleet_protocol::turn::ModelConfig,
    rounds: u32,
    tool_calls: Vec<fleet_protocol::turn::PendingCall>,
    final_message: Option<Value>,
    usage: fleet_protocol::turn::Usage,
    /// Whose turn it is.
    tenant: Option<String>,
}

impl From<fleet_protocol::turn::TurnState> for TurnSummary {
    fn from(t: fleet_protocol::turn::TurnState) -> Self {
        TurnSummary {
            session_id: t.session_id,
            message_id: t.message_id,
            model_config: t.assistant.model_config,
            rounds: t.round,
            tool_calls: t.tool_calls,
            final_message: t.final_message,
            usage: t.usage,
            tenant: t.tenant,
        }
    }
}

/// The summary of turn `execution_id`, if it has a state.
pub(crate) async fn turn_summary(state: &AppState, execution_id: &str) -> Result<Option<TurnSummary>, ApiError> {
    Ok(state.store.sessions().load_turn(execution_id).await?.map(TurnSummary::from))
}

/// This module's routes, each with its OpenAPI operation (path, method, scope): adding a route
/// here is all it takes to serve, document and guard it.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new().routes(utoipa_axum::routes!(create_turn))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_turns_digest_ignores_key_order_and_spacing_but_not_content() {
        let parse = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        let a = parse(r#"{"session_id":"s","messages":[{"role":"user","content":"hi"}]}"#);
        let b = parse(r#"{ "messages": [ {"content": "hi", "role": "user"} ], "session_id": "s" }"#);
        let c = parse(r#"{"session_id":"s","messages":[{"role":"user","content":"ho"}]}"#);
        assert_eq!(super::turn_digest(&a), super::turn_digest(&b));
        assert_ne!(super::turn_digest(&a), super::turn_digest(&c));
    }
}
