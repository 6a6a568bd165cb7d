//! A tool-call job: the signed callback to the tool's owner; a call a model made also reports to
//! its turn, however it ends.

use serde_json::json;

use fleet_platform::broker::Publisher;
use fleet_protocol::deadletter::DeadLetterRecord;
use fleet_protocol::envelope::{Envelope, ToolCallJob};
use fleet_protocol::turn::CallOutcome;

use crate::process::Processor;
use crate::settle::Outcome;

pub(super) async fn run(p: &Processor, publisher: &Publisher, envelope: &Envelope, call: &ToolCallJob) -> Outcome {
    let parent = call.parent.as_ref().map(|turn| (turn, call.tool_name.as_str()));
    super::callback_job::run(p, publisher, envelope, parent).await
}

/// A tool call that failed for good: its failure events, then its turn gets the error as the
/// call's result. Event ids derive from the execution, so a second run delivers them once.
pub(super) async fn aftermath(
    p: &Processor,
    publisher: &Publisher,
    call: &ToolCallJob,
    dead: &DeadLetterRecord,
) -> Result<(), String> {
    p.emit_failure_events(publisher, dead).await.map_err(|e| format!("cannot emit failure events: {e}"))?;
    let Some(parent) = &call.parent else { return Ok(()) };
    let error = json!({"error": dead.last_error, "dead_lettered": true});
    let outcome = CallOutcome { ok: false, result: error };
    super::parent::tool_call_finished(p, publisher, parent, &call.tool_name, outcome).await
}
