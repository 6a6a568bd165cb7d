//! A tool-call job: the signed callback to the tool's owner; a call a model made also reports to
//! its turn, however it ends.

use serde_json::json;

use fleet_protocol::dead_letters::DeadLetterRecord;
use fleet_protocol::envelope::{Envelope, ToolCallJob};
use fleet_protocol::external_result::ExternalResult;
use fleet_protocol::turn::CallOutcome;

use super::parent::{self, Parent};
use crate::context::Cx;
use crate::outcome::Outcome;

pub(super) async fn run(cx: &Cx<'_>, envelope: &Envelope, call: &ToolCallJob) -> Outcome {
    super::callback_job::run(cx, envelope, Parent::of(call)).await
}

/// A call cancelled before it was sent: its turn gets the cancellation as the call's result.
pub(super) async fn cancelled(cx: &Cx<'_>, envelope: &Envelope, call: &ToolCallJob) -> Outcome {
    parent::cancelled(cx, envelope, Parent::of(call).as_ref()).await
}

/// A tool call that failed for good: its failure events, then its turn gets the error as the
/// call's result. Event ids derive from the execution, so a second run delivers them once.
pub(super) async fn aftermath(
    cx: &Cx<'_>,
    envelope: &Envelope,
    call: &ToolCallJob,
    dead: &DeadLetterRecord,
) -> Result<(), String> {
    crate::notify::emit_failure_events(cx, dead, envelope.enqueued_at_ms)
        .await
        .map_err(|e| format!("cannot emit failure events: {e}"))?;
    let Some(parent) = Parent::of(call) else { return Ok(()) };
    let error = json!({"error": dead.last_error, "dead_lettered": true});
    let timed_out = dead.history.last().is_some_and(|a| a.timed_out);
    let external = ExternalResult::dead_lettered(&envelope.execution_id, &call.tool_name, timed_out, &dead.last_error);
    let outcome = CallOutcome { ok: false, result: error, external: Some(external) };
    let told = parent::tool_call_finished(cx, envelope, &parent, outcome).await;
    told.map_err(|_| "cannot tell the call's turn".to_string())
}
