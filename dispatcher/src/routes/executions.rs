//! `GET /v1/executions/{id}`: an execution's record (and a turn's summary).

use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use fleet_platform::store::ExecutionView;
use fleet_protocol::timefmt::rfc3339_from_millis;

use crate::error::ApiError;
use crate::AppState;

fn execution_json(v: &ExecutionView) -> Value {
    json!({
        "execution_id": v.execution_id,
        "kind": v.kind,
        "status": v.status.as_str(),
        "tool_name": v.tool_name,
        "room_id": v.room_id,
        "assistant_id": v.assistant_id,
        "created_at": rfc3339_from_millis(v.created_at_ms),
        "updated_at": rfc3339_from_millis(v.updated_at_ms),
        "attempts": v.attempts,
        "result": v.result,
        "last_error": v.last_error,
    })
}

#[utoipa::path(get, path = "/v1/executions/{id}", tag = "executions", security(("bearer" = ["executions:read"])),
    params(("id" = String, Path, description = "The execution id a 202 returned")),
    responses((status = 200, description = "The execution", body = crate::routes::docs::ExecutionResponse),
        (status = 404, description = "No such execution", body = crate::routes::docs::ErrorBody), crate::routes::docs::CommonErrors))]
pub(crate) async fn get_execution(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if !fleet_protocol::envelope::is_valid_execution_id(&id) {
        return Err(ApiError::not_found(format!("no execution {id:?}")));
    }
    let view =
        state.store.get_execution(&id).await?.ok_or_else(|| ApiError::not_found(format!("no execution {id:?}")))?;
    let mut data = execution_json(&view);
    if view.kind == "turn" {
        if let Some(turn) = crate::routes::turns::turn_summary(&state, &id).await? {
            data["turn"] = turn;
        }
    }
    Ok(Json(json!({"data": data})))
}
