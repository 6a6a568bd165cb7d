//! Seed 000's rooms and messages: `POST /v1/agents/{assistant_id}/rooms`, `GET /v1/agents/rooms`,
//! `GET /v1/agents/rooms/{room_id}`, `POST …/close`, `POST|GET …/messages`, `GET …/stream` and
//! `POST …/stream-token`. A room is a session (the room's id is the session's id): its stream,
//! history and turns are the session's. A message is a turn like `POST /v1/turns`'s, accepted by
//! the same `submit` (a confirmed publish before the answer), whose assistant is a copy of the
//! room's assistant as it is when the message is sent.

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;

use fleet_platform::now_ms;
use fleet_platform::store::RoomVersion;
use fleet_protocol::agents::{self, ListRequest, MessageInput, RoomFilter, RoomInput, RoomOut, RoomRecord, RoomStatus};
use fleet_protocol::history::{MessageOut, PageRequest};
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::turn::{InputMessage, TurnInput};

use crate::error::ApiError;
use crate::routes::closing::{busy, closed};
use crate::routes::common::{
    check_session, claim_session, require_json, ApiQuery, Body, JsonInput, RequestKey, Tenancy,
};
use crate::routes::sessions::MessagePage;
use crate::routes::stream::StreamToken;
use crate::routes::submit::{mark_replayed, submit_job};
use crate::routes::turns::{check_turn, digest, NewTurn};
use crate::wire::Data;
use crate::{validate, AppState};

fn no_room(id: &str) -> ApiError {
    ApiError::not_found(format!("no room with id {:?}", id.chars().take(80).collect::<String>()))
}

/// The room `id` names, as stored (an id of the wrong shape names none).
async fn find(state: &AppState, id: &str) -> Result<Option<RoomVersion>, ApiError> {
    if !agents::is_id("room_", id) {
        return Ok(None);
    }
    Ok(state.store.registry().read_room(id).await?)
}

async fn require_room(state: &AppState, id: &str) -> Result<RoomVersion, ApiError> {
    find(state, id).await?.ok_or_else(|| no_room(id))
}

/// The room, if the caller may see it: a tenant-bound token sees only its tenant's rooms (a room
/// is a session, bound to its creator's tenant); another's is 404, as a room that does not exist.
async fn visible_room(state: &AppState, tenancy: &Tenancy, id: &str) -> Result<RoomVersion, ApiError> {
    check_session(state, tenancy, id)
        .await
        .map_err(|e| if e.status == StatusCode::NOT_FOUND { no_room(id) } else { e })?;
    require_room(state, id).await
}

/// The room with its `message_count` and `last_message_at` (from its message log).
async fn with_counts(state: &AppState, room: &RoomRecord) -> Result<RoomOut, ApiError> {
    let (count, last) = state.store.sessions().log_summary(&room.id).await?;
    Ok(room.to_api(Some((count, last.as_ref().map(|m| m.created_at.as_str())))))
}

/// Starts a conversation with the assistant (the seed's "Create a Room"): `namespace` (e.g. the
/// user) and `metadata` are optional.
#[utoipa::path(post, path = "/v1/agents/{assistant_id}/rooms", extensions(("x-tenancy" = json!("resource"))), tag = "rooms", security(("bearer" = ["sessions:write"])),
    params(("assistant_id" = String, Path, description = "The assistant's id (`asst_…`)")),
    request_body(content = fleet_protocol::agents::RoomInput, description = "`namespace` and `metadata`, both optional (an empty body will do)"),
    responses((status = 201, description = "Created, `active`", body = Data<RoomOut>),
        (status = 404, description = "No such assistant", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn create_room(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path(assistant_id): Path<String>,
    headers: HeaderMap,
    Body(body): Body,
) -> Result<(StatusCode, Json<Data<RoomOut>>), ApiError> {
    require_json(&headers)?;
    let input: RoomInput = if body.is_empty() { RoomInput::default() } else { validate::parse_body(&body)? };
    crate::routes::assistants::find(&state, &tenancy, &assistant_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no assistant with id {assistant_id:?}")))?;
    let room = input.create(agents::new_room_id(), &assistant_id, now_ms()).map_err(ApiError::invalid)?;
    // The room's session is its creator's tenant's from the start, for as long as the room lives
    // (rooms never expire, so neither does that binding).
    claim_session(&state, &tenancy, &room.id, &tenancy.resolve(None)?).await?;
    state.store.sessions().session_binding_persist(&room.id).await?;
    if !state.store.registry().write_room(&room, None).await? {
        return Err(busy());
    }
    Ok((StatusCode::CREATED, Data::json(room.to_api(None))))
}

/// Rooms newest first (`data.rooms`), filtered by `namespace`, `assistant_id` and `status`.
#[utoipa::path(get, path = "/v1/agents/rooms", extensions(("x-tenancy" = json!("listing"))), tag = "rooms", security(("bearer" = ["sessions:read"])),
    params(("namespace" = Option<String>, Query, description = "Only this namespace's rooms"),
        ("assistant_id" = Option<String>, Query, description = "Only this assistant's rooms"),
        ("status" = Option<fleet_protocol::agents::RoomStatus>, Query, description = "`active` or `closed`"),
        ("limit" = Option<u32>, Query, description = "1-100 (default 50)", minimum = 1, maximum = 100),
        ("cursor" = Option<String>, Query, description = "`next_cursor` from the previous page")),
    responses((status = 200, description = "Rooms, newest first; a page may be short with `has_more` when namespace and assistant_id filter together", body = Data<RoomPage>),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn list_rooms(
    State(state): State<AppState>,
    tenancy: Tenancy,
    ApiQuery(q): ApiQuery<HashMap<String, String>>,
) -> Result<Json<Data<RoomPage>>, ApiError> {
    let arg = |name: &str| q.get(name).map(String::as_str);
    let filter = RoomFilter::parse(arg("namespace"), arg("assistant_id"), arg("status")).map_err(ApiError::invalid)?;
    let req = ListRequest::parse(arg("limit"), arg("cursor")).map_err(ApiError::invalid)?;
    let listed = state.store.registry().list_rooms(&filter, req.after.as_deref(), req.limit).await?;
    // A tenant-bound token's page holds only its tenant's rooms (it may so come back short).
    let mut entries: Vec<&RoomRecord> = listed.entries.iter().collect();
    if tenancy.bound.is_some() {
        let ids: Vec<&str> = entries.iter().map(|r| r.id.as_str()).collect();
        let owners = state.store.sessions().session_tenants(&ids).await?;
        entries = entries.into_iter().zip(owners).filter(|(_, o)| tenancy.sees(o.as_deref())).map(|(r, _)| r).collect();
    }
    Ok(Data::json(RoomPage {
        rooms: entries.iter().map(|r| r.to_api(None)).collect(),
        has_more: listed.next.is_some(),
        next_cursor: listed.next.as_deref().map(agents::encode_cursor),
    }))
}

/// A page of rooms, the seed's listing shape.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RoomPage {
    /// Newest first.
    pub rooms: Vec<RoomOut>,
    pub has_more: bool,
    /// Pass as `cursor` for the next page; null at the end.
    pub next_cursor: Option<String>,
}

#[utoipa::path(get, path = "/v1/agents/rooms/{room_id}", extensions(("x-tenancy" = json!("resource"))), tag = "rooms", security(("bearer" = ["sessions:read"])),
    params(("room_id" = String, Path, description = "The room's id (`room_…`)")),
    responses((status = 200, description = "The room, with `message_count` and `last_message_at`", body = Data<RoomOut>),
        (status = 404, description = "No such room", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn get_room(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path(id): Path<String>,
) -> Result<Json<Data<RoomOut>>, ApiError> {
    let room = visible_room(&state, &tenancy, &id).await?.record;
    Ok(Data::json(with_counts(&state, &room).await?))
}

/// Closes the room (again: no change): it refuses new messages (409 `room_closed`), and its
/// messages, history and stream stay readable.
#[utoipa::path(post, path = "/v1/agents/rooms/{room_id}/close", extensions(("x-tenancy" = json!("resource"))), tag = "rooms", security(("bearer" = ["sessions:write"])),
    params(("room_id" = String, Path, description = "The room's id (`room_…`)")),
    responses((status = 200, description = "The room, `closed`", body = Data<RoomOut>),
        (status = 404, description = "No such room", body = crate::routes::docs::ErrorBody),
        (status = 409, description = "It kept changing (`room_busy`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn close_room(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path(id): Path<String>,
) -> Result<Json<Data<RoomOut>>, ApiError> {
    if !agents::is_id("room_", &id) {
        return Err(no_room(&id));
    }
    visible_room(&state, &tenancy, &id).await?;
    let room = crate::routes::closing::close(&state, &id).await?.ok_or_else(|| no_room(&id))?;
    Ok(Data::json(with_counts(&state, &room).await?))
}

/// Sends a user message (the seed's "Send a Message"): answers the stored message at once (201,
/// with the `execution_id` of the assistant's turn) once the broker confirmed the turn, which
/// starts after the room's running turn (`behavior: follow_up`, the default) or joins it
/// (`steer`). The assistant's reply, its tool calls and their results come on the room's stream
/// and in its messages as they are made. `Idempotency-Key` is honoured as on `POST /v1/turns`.
#[utoipa::path(post, path = "/v1/agents/rooms/{room_id}/messages", extensions(("x-tenancy" = json!("resource"))), tag = "rooms", security(("bearer" = ["turns:write"])),
    params(("room_id" = String, Path, description = "The room's id (`room_…`)"),
        ("Idempotency-Key" = Option<String>, Header, description = "1-255 visible ASCII characters; as on POST /v1/turns")),
    request_body(content = fleet_protocol::agents::MessageInput, description = "The user's message"),
    responses((status = 201, description = "The stored user message; the broker confirmed the assistant's turn", body = Data<MessageOut>,
            headers(("idempotent-replayed" = String, description = "`true` when the answer replays an earlier request's"))),
        (status = 404, description = "No such room", body = crate::routes::docs::ErrorBody),
        (status = 409, description = "The room is closed (`room_closed`), its assistant was deleted (`assistant_deleted`), or a request with this key is still being accepted (`request_in_progress`)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn send_message(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path(room_id): Path<String>,
    RequestKey(idempotency_key): RequestKey,
    headers: HeaderMap,
    JsonInput { value: input, .. }: JsonInput<MessageInput>,
) -> Result<Response, ApiError> {
    input.check().map_err(ApiError::invalid)?;
    let room = visible_room(&state, &tenancy, &room_id).await?.record;
    if room.status == RoomStatus::Closed {
        return Err(closed(&room.id));
    }
    let assistant = state.store.registry().get_assistant(&room.assistant_id).await?.ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "assistant_deleted",
            format!("room {}'s assistant {} was deleted: the room takes no new messages", room.id, room.assistant_id),
        )
    })?;
    let mut turn = TurnInput {
        session_id: room.id.clone(),
        assistant: assistant.snapshot(),
        messages: vec![InputMessage { role: "user".into(), content: input.content.clone() }],
        behavior: input.behavior,
        tenant: None,
        priority: Default::default(),
        agent: assistant.agent_turn(None),
    };
    check_turn(&state, &tenancy, &mut turn, &format!("assistant {}'s enabled_tools", assistant.id)).await?;
    let canonical = json!({"room_id": room.id, "role": "user", "content": input.content, "behavior": input.behavior});
    let turn = NewTurn::new(turn, digest("room-message", &canonical), "POST /v1/agents/rooms/{room_id}/messages");
    let sent = turn.sent_at_ms();
    let job = submit_job(&state, idempotency_key, &headers, turn).await?;
    let as_sent = fleet_protocol::history::sent_entries(
        &job.execution_id,
        &[("user".to_string(), input.content)],
        &rfc3339_from_millis(sent),
    );
    let mut message = as_sent.into_iter().next().expect("one message sent");
    if job.replayed {
        // The earlier request's message, as it was stored then.
        let logged = state.store.sessions().logged_messages(&room.id).await?;
        if let Some(stored) = logged.into_iter().rev().find(|m| m.id == message.id) {
            message = stored;
        }
    }
    let mut response = (StatusCode::CREATED, Data::json(message.to_api())).into_response();
    if job.replayed {
        mark_replayed(&mut response);
    }
    Ok(response)
}

/// The room's messages as they were made: the users', the assistant's (with its `tool_calls`),
/// and tool results; newest first unless `order=asc`, in pages with an opaque cursor.
#[utoipa::path(get, path = "/v1/agents/rooms/{room_id}/messages", extensions(("x-tenancy" = json!("resource"))), tag = "rooms", security(("bearer" = ["sessions:read"])),
    params(("room_id" = String, Path, description = "The room's id (`room_…`)"),
        ("limit" = Option<u32>, Query, description = "1-100 (default 50)", minimum = 1, maximum = 100),
        ("cursor" = Option<String>, Query, description = "`next_cursor` from the previous page"),
        ("order" = Option<fleet_protocol::history::Order>, Query, description = "`desc` (newest first, default) or `asc`")),
    responses((status = 200, description = "The room's messages", body = Data<MessagePage>),
        (status = 404, description = "No such room", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn list_messages(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path(room_id): Path<String>,
    ApiQuery(q): ApiQuery<HashMap<String, String>>,
) -> Result<Json<Data<MessagePage>>, ApiError> {
    let arg = |name: &str| q.get(name).map(String::as_str);
    let req = PageRequest::parse(arg("limit"), arg("cursor"), arg("order")).map_err(ApiError::invalid)?;
    visible_room(&state, &tenancy, &room_id).await?;
    let log = state.store.sessions().logged_messages(&room_id).await?;
    Ok(Data::json(MessagePage::of(&log, &req)))
}

/// The room's events (its session's stream) as SSE in the seed's wire format, as
/// `GET /v1/sessions/{id}/stream` serves them; `?token=` (a stream token) instead of a bearer token.
#[utoipa::path(get, path = "/v1/agents/rooms/{room_id}/stream", extensions(("x-tenancy" = json!("resource"))), tag = "rooms", security(("bearer" = ["sessions:read"])),
    params(("room_id" = String, Path, description = "The room's id (`room_…`)"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event (an id this stream sent)"),
        ("last_event_id" = Option<String>, Query, description = "Like the Last-Event-ID header (the header wins)"),
        ("since" = Option<String>, Query, description = "`start`: replay the retained window; `now` (default): new events only"),
        ("until" = Option<String>, Query, description = "`done`: close the stream after the next `done` event"),
        ("token" = Option<String>, Query, description = "A stream token from POST /v1/agents/rooms/{room_id}/stream-token (for EventSource)")),
    responses((status = 200, description = "The room's events as server-sent events", content_type = "text/event-stream", body = String),
        (status = 404, description = "No such room", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn stream_room(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path(room_id): Path<String>,
    ApiQuery(query): ApiQuery<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    visible_room(&state, &tenancy, &room_id).await?;
    crate::routes::stream::serve(&state, room_id, &headers, &query).await
}

/// A token that opens this room's stream (and nothing else) for 60 seconds, for a browser's
/// `EventSource`: the seed's top-level `streaming_token`, and the fleet's `data`.
#[utoipa::path(post, path = "/v1/agents/rooms/{room_id}/stream-token", extensions(("x-tenancy" = json!("resource"))), tag = "rooms", security(("bearer" = ["sessions:read"])),
    params(("room_id" = String, Path, description = "The room's id (`room_…`)")),
    responses((status = 200, description = "The stream token", body = RoomStreamTokenOut),
        (status = 404, description = "No such room", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn create_stream_token(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path(room_id): Path<String>,
) -> Result<Json<RoomStreamTokenOut>, ApiError> {
    visible_room(&state, &tenancy, &room_id).await?;
    let token = crate::routes::stream::stream_token_for(&state, &room_id);
    Ok(Json(RoomStreamTokenOut {
        streaming_token: token.token.clone(),
        expires_in: token.expires_in,
        data: RoomStreamToken { streaming_token: token.token.clone(), room_id, token },
    }))
}

/// A room's stream token: `token` opens the room's stream with `?token=` for 60 seconds.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = StreamTokenResponse)]
pub(crate) struct RoomStreamTokenOut {
    /// The token, where seed 000's clients read it (`const { streaming_token } = …`).
    streaming_token: String,
    /// Seconds it stays valid (60).
    #[schema(minimum = 0)]
    expires_in: i64,
    data: RoomStreamToken,
}

/// A stream token with the room's names for it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RoomStreamToken {
    #[serde(flatten)]
    token: StreamToken,
    /// The same token, under the seed's name.
    streaming_token: String,
    room_id: String,
}

/// This module's routes, each with its OpenAPI operation (path, method, scope): adding a route
/// here is all it takes to serve, document and guard it.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(create_room))
        .routes(utoipa_axum::routes!(list_rooms))
        .routes(utoipa_axum::routes!(get_room))
        .routes(utoipa_axum::routes!(close_room))
        .routes(utoipa_axum::routes!(send_message, list_messages))
        .routes(utoipa_axum::routes!(stream_room))
        .routes(utoipa_axum::routes!(create_stream_token))
}
