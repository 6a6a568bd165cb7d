//! One attempt of a call to an MCP server's tool: a `tools/call` through the worker's MCP sessions
//! instead of a signed POST, and what its answer means for the job, as seed 002's `ExternalResult`.
//! An outcome the fleet cannot know (the request went out, no answer came back) is not sent again
//! unless the tool says a repeat is harmless or the server's operator allows it.

use fleet_platform::mcp::{CallAnswer, McpClients};
use fleet_protocol::envelope::ToolCallJob;
use fleet_protocol::external_result::{ExternalResult, InteractionError, ResultStatus};
use fleet_protocol::mcp::checked_against;
use fleet_protocol::sanitize::sanitize_error;
use fleet_protocol::schema::ToolSchema;
use fleet_protocol::tools::McpToolRef;

use crate::callback::{AttemptReport, AttemptVerdict, CallbackContext};

/// The error code of a call whose outcome is unknown.
pub const OUTCOME_UNKNOWN: &str = "MCP_OUTCOME_UNKNOWN";
const OUTCOME_UNKNOWN_MESSAGE: &str =
    "The MCP server may or may not have run the call; check its state before calling it again";
/// The metric class of an unknown outcome that is tried again (no signal for the circuit).
const UNKNOWN_CLASS: &str = "unknown";

/// What the call is: the model's call id (or the execution's), and `server:tool`.
struct Called<'a> {
    call_id: &'a str,
    source: String,
}

/// The tool called and its compiled `outputSchema`, when it has one (`Err`: it does not compile).
pub(crate) type CalledTool<'a> = (&'a McpToolRef, Option<Result<&'a ToolSchema, &'a String>>);

/// Calls `tool` for `call` and judges the answer, a success checked against the tool's
/// `outputSchema`. Its error is sanitised; what comes back passes the worker's redactor.
pub(crate) async fn attempt(
    ctx: &CallbackContext<'_>,
    clients: &McpClients,
    execution_id: &str,
    call: &ToolCallJob,
    (tool, output_schema): CalledTool<'_>,
) -> AttemptReport {
    let called = Called {
        call_id: call.parent.as_ref().map_or(execution_id, |p| p.call_id.as_str()),
        source: format!("{}:{}", tool.server, tool.tool),
    };
    let server = match server_of(ctx, &tool.server).await {
        Ok(server) => server,
        Err(report) => return report,
    };
    let (target, retry_unknown) = (&server.0, server.1);
    let arguments = call.parameters.as_object().cloned().unwrap_or_default();
    let answer = clients.call_tool(target, &tool.tool, arguments, called.call_id, ctx.callback_timeout).await;
    let answer = match (answer, output_schema) {
        (CallAnswer::Answered(result), Some(schema)) => CallAnswer::Answered(checked_against(schema, result)),
        (answer, _) => answer,
    };
    let mut report = judge(answer, &called, tool.hints.repeatable() || retry_unknown);
    report.error = report.error.map(|e| sanitize_error(&ctx.redactor.redact_with(None, &e)));
    if let AttemptVerdict::Structured(result) = &mut report.verdict {
        result.scrub_with(|value| ctx.redactor.redact_json(None, value));
    }
    report
}

/// The server `name` as its calls reach it: from the worker's cache, else read and decrypted.
async fn server_of(ctx: &CallbackContext<'_>, name: &str) -> Result<crate::context::McpServerEntry, AttemptReport> {
    if let Some(entry) = ctx.mcp_servers.get(name) {
        return Ok(entry);
    }
    let server = match ctx.store.registry().get_mcp_server(name).await {
        Ok(Some(server)) => server,
        Ok(None) => return Err(refused(format!("MCP server {name:?} is no longer registered"))),
        Err(e) => return Err(unsent(format!("registry unavailable: {e}"), "registry")),
    };
    let target = match server.target(ctx.secrets) {
        Ok(target) => target,
        Err(e) => return Err(refused(format!("MCP server headers cannot be used: {e}"))),
    };
    let entry = std::sync::Arc::new((target, server.retry_unknown));
    ctx.mcp_servers.put(name, entry.clone());
    Ok(entry)
}

/// What an answer means (pure): a success is the result; a failure the server reported ends the
/// call (the model reads it); a request not sent is retried like a transport failure, and so is a
/// timeout; an unknown outcome ends the call `unknown` unless `repeatable`.
fn judge(answer: CallAnswer, called: &Called<'_>, repeatable: bool) -> AttemptReport {
    let report = |verdict, http_status, error, class| AttemptReport { verdict, http_status, error, class };
    match answer {
        CallAnswer::Answered(result) if result.is_success() => {
            report(AttemptVerdict::Structured(Box::new(result)), Some(200), None, "2xx")
        }
        CallAnswer::Answered(result) => {
            let error = result.error.as_ref().map(|e| format!("MCP tool {}: {}", e.code, e.message));
            report(AttemptVerdict::Structured(Box::new(result)), Some(200), error, "2xx")
        }
        CallAnswer::Unsent(why) => unsent(format!("MCP call not sent: {why}"), "network"),
        CallAnswer::TimedOut => {
            let verdict = AttemptVerdict::Retryable { retry_after: None };
            report(verdict, None, Some("MCP call timed out".into()), "timeout")
        }
        CallAnswer::Unknown(why) if repeatable => {
            let verdict = AttemptVerdict::Retryable { retry_after: None };
            report(verdict, None, Some(format!("MCP call outcome unknown, sent again: {why}")), UNKNOWN_CLASS)
        }
        CallAnswer::Unknown(why) => {
            let error = format!("MCP call outcome unknown: {why}");
            report(AttemptVerdict::Structured(Box::new(unknown(called))), None, Some(error), UNKNOWN_CLASS)
        }
    }
}

fn unknown(called: &Called<'_>) -> ExternalResult {
    let error = InteractionError::safe(OUTCOME_UNKNOWN, OUTCOME_UNKNOWN_MESSAGE, Some(false));
    ExternalResult::ended(called.call_id, &called.source, ResultStatus::Unknown, error)
}

fn unsent(error: String, class: &'static str) -> AttemptReport {
    let verdict = AttemptVerdict::Retryable { retry_after: None };
    AttemptReport { verdict, http_status: None, error: Some(error), class }
}

fn refused(error: String) -> AttemptReport {
    AttemptReport { verdict: AttemptVerdict::Permanent, http_status: None, error: Some(error), class: "refused" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lost() -> fleet_platform::mcp::McpError {
        fleet_platform::mcp::McpError::Lost { server: "files".into(), method: "tools/call", detail: "reset".into() }
    }

    fn called() -> Called<'static> {
        Called { call_id: "c1", source: "files:write".into() }
    }

    #[test]
    fn answers_map_to_verdicts() {
        let ok = ExternalResult::success("c1", "files:write", json!({"n": 1}));
        let answered = judge(CallAnswer::Answered(ok.clone()), &called(), false);
        assert_eq!(answered.verdict, AttemptVerdict::Structured(Box::new(ok)));
        let error = InteractionError::safe("MCP_TOOL_ERROR", "no such file", None);
        let failed = ExternalResult::ended("c1", "files:write", ResultStatus::Failed, error);
        let report = judge(CallAnswer::Answered(failed.clone()), &called(), true);
        assert_eq!(report.verdict, AttemptVerdict::Structured(Box::new(failed)), "a reported failure is never retried");
        for answer in [CallAnswer::Unsent(lost()), CallAnswer::TimedOut] {
            assert!(matches!(judge(answer, &called(), false).verdict, AttemptVerdict::Retryable { .. }));
        }
    }

    #[test]
    fn an_unknown_outcome_is_retried_only_when_a_repeat_is_harmless() {
        let once = judge(CallAnswer::Unknown(lost()), &called(), false);
        let AttemptVerdict::Structured(result) = once.verdict else { panic!("{:?}", once.verdict) };
        assert_eq!(result.status, ResultStatus::Unknown);
        assert_eq!(result.error.as_ref().map(|e| e.code.as_str()), Some(OUTCOME_UNKNOWN));
        assert!(result.observation_text().contains("check its state"));
        let again = judge(CallAnswer::Unknown(lost()), &called(), true);
        assert!(matches!(again.verdict, AttemptVerdict::Retryable { .. }));
        assert_eq!(again.class, UNKNOWN_CLASS);
    }
}
