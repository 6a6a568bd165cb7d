//! Closing rooms, below the routes that need it: a closed room's refusal of new input (turns,
//! seed 001's inputs, a room's messages), closing one room, and closing a deleted assistant's.

use axum::http::StatusCode;

use fleet_platform::now_ms;
use fleet_protocol::agents::{RoomRecord, RoomStatus};

use crate::error::ApiError;
use crate::AppState;

/// Conditional writes tried before a request gives up on a room that keeps changing under it.
pub(crate) const WRITE_ATTEMPTS: usize = 5;
/// Rooms closed per round when an assistant is deleted, and rounds at most.
const CLOSE_BATCH: usize = 100;
const CLOSE_ROUNDS: usize = 1_000;

pub(crate) fn busy() -> ApiError {
    ApiError::new(StatusCode::CONFLICT, "room_busy", "the room kept changing while this request wrote it; try again")
}

/// A closed room's refusal of new input (a message, a turn, a seed 001 input).
pub(crate) fn closed(room_id: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "room_closed",
        format!("room {room_id} is closed: it takes no new messages (its messages stay readable)"),
    )
}

/// Closes room `id` (a closed one stays as it was); `None` if there is none.
pub(crate) async fn close(state: &AppState, id: &str) -> Result<Option<RoomRecord>, ApiError> {
    for _ in 0..WRITE_ATTEMPTS {
        let Some(current) = state.store.registry().read_room(id).await? else { return Ok(None) };
        if current.record.status == RoomStatus::Closed {
            return Ok(Some(current.record));
        }
        let next = current.record.closed(now_ms());
        if state.store.registry().write_room(&next, Some(&current)).await? {
            return Ok(Some(next));
        }
    }
    Err(busy())
}

/// Closes the active rooms of a deleted assistant; how many it closed. A room it could not
/// close refuses messages all the same (its assistant is gone).
pub(crate) async fn close_rooms_of(state: &AppState, assistant_id: &str) -> u64 {
    let mut closed = 0;
    for _ in 0..CLOSE_ROUNDS {
        let ids = match state.store.registry().active_rooms_of(assistant_id, CLOSE_BATCH).await {
            Ok(ids) if !ids.is_empty() => ids,
            Ok(_) => break,
            Err(e) => {
                tracing::warn!(error = %e, assistant_id, "could not list a deleted assistant's rooms");
                break;
            }
        };
        let before = closed;
        for id in ids {
            match close(state, &id).await {
                Ok(Some(_)) => closed += 1,
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e.message, room_id = id, "could not close a deleted assistant's room")
                }
            }
        }
        if closed == before {
            break;
        }
    }
    closed
}
