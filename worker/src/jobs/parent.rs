//! The one hook for "a tool call a turn made has ended", called however it ended (success, a
//! copy carrying the report it owed, dead letter, cancel): the outcome is recorded on the turn
//! under the call's key, and the report that completes the round publishes the turn's next step.

use serde_json::json;

use fleet_platform::store::RoundState;
use fleet_protocol::envelope::{Envelope, Job, ToolCallJob, TurnJob, TurnParent};
use fleet_protocol::execution::field;
use fleet_protocol::external_result::ExternalResult;
use fleet_protocol::history;
use fleet_protocol::life::Owed;
use fleet_protocol::turn::{self, CallOutcome};

use fleet_protocol::agent_session;

use super::stream::emit;
use crate::context::Cx;
use crate::outcome::{Finished, Outcome};
use crate::overrides::Secrets;
use crate::publish::{publish_holding, trace_headers};

/// The turn waiting for a tool call's result: which call of which round, the tool, the session.
pub(crate) struct Parent<'a> {
    pub turn: &'a TurnParent,
    pub tool_name: &'a str,
    pub session_id: Option<&'a str>,
}

impl<'a> Parent<'a> {
    /// The turn a tool-call job answers, if a model made the call.
    pub(crate) fn of(call: &'a ToolCallJob) -> Option<Self> {
        call.parent.as_ref().map(|turn| Parent {
            turn,
            tool_name: &call.tool_name,
            session_id: call.room_id.as_deref(),
        })
    }
}

/// A call cancelled before it was sent: nothing is sent; its turn gets the cancellation as the
/// call's result (it must not wait for it).
pub(crate) async fn cancelled(cx: &Cx<'_>, envelope: &Envelope, parent: Option<&Parent<'_>>) -> Outcome {
    tracing::info!("cancelled before its attempt; nothing sent");
    let Some(parent) = parent else { return Outcome::Done(Finished::Cancelled) };
    let error = json!({"error": "the tool call was cancelled before it was sent", "cancelled": true});
    let external = ExternalResult::cancelled(&envelope.execution_id, parent.tool_name);
    match tool_call_finished(cx, envelope, parent, CallOutcome { ok: false, result: error, external: Some(external) })
        .await
    {
        Ok(()) => Outcome::Done(Finished::Cancelled),
        Err(outcome) => outcome,
    }
}

/// A call's result joins the session's message log as it comes (once per call).
async fn log_result(cx: &Cx<'_>, turn_id: &str, parent: &Parent<'_>, outcome: &CallOutcome, session: &str) {
    let content = turn::tool_message_content(outcome, cx.config.tool_result_max_bytes);
    let created_at = fleet_protocol::timefmt::rfc3339_from_millis(fleet_platform::now_ms());
    let entry = history::result_entry(turn_id, &parent.turn.call_key(), &parent.turn.call_id, &content, &created_at);
    if let Err(e) = cx.store.sessions().log_message(session, &entry).await {
        tracing::warn!(error = %e, "the tool result is not in the session's message log");
    }
}

/// What a tool configuration's overrides gave the call, as events show it (secrets `****`):
/// recomputed against the session as the result is reported; `null` if they no longer resolve.
async fn shown_overrides(cx: &Cx<'_>, turn_id: &str, configuration: &str) -> serde_json::Value {
    let Ok(Some(state)) = cx.store.sessions().load_turn(turn_id).await else { return serde_json::Value::Null };
    let resolved = crate::overrides::resolve(cx.store, Secrets::Shut, &state, turn_id, configuration).await;
    resolved.map_or(serde_json::Value::Null, |r| serde_json::Value::Object(r.shown))
}

/// `Err` is how the call's delivery ends instead (its turn may not know yet: it must not be acked
/// away).
pub(crate) async fn tool_call_finished(
    cx: &Cx<'_>,
    call: &Envelope,
    parent: &Parent<'_>,
    outcome: CallOutcome,
) -> Result<(), Outcome> {
    let turn_id = &parent.turn.turn_execution_id;
    let round = parent.turn.round + 1;
    let report =
        cx.store.sessions().record_call_outcome(turn_id, &parent.turn.call_key(), &outcome, round).await.map_err(
            |e| {
                tracing::warn!(error = %e, "cannot record a tool result for its turn");
                Outcome::Parked(cx.soon())
            },
        )?;
    let session = parent.session_id.unwrap_or_default();
    if report.first && !session.is_empty() {
        log_result(cx, turn_id, parent, &outcome, session).await;
        let call_id = &parent.turn.call_id;
        let mut event = if outcome.answered() {
            turn::tool_result_event(call_id, parent.tool_name, &outcome, &report.message_id)
        } else {
            let mut error = outcome.result.to_string();
            let code = match outcome.result["error"]["code"].as_str() {
                // Seed 002's refusal by an approval: its code (`APPROVAL_DENIED`, …) and safe message.
                Some(code) if fleet_protocol::approvals::is_refusal(&outcome.result) => {
                    error = outcome.result["error"]["message"].as_str().unwrap_or_default().to_string();
                    code
                }
                _ if outcome.result["cancelled"] == true => "cancelled",
                _ => "tool_callback_failed",
            };
            turn::error_event(code, &error, Some((call_id, parent.tool_name)), &report.message_id)
        };
        if let Some(configuration) = &parent.turn.configuration {
            let shown = shown_overrides(cx, turn_id, configuration).await;
            agent_session::name_configuration(&mut event, configuration, "resolved_argument_overrides", shown);
        }
        emit(cx, session, event).await;
    }
    if report.round != RoundState::Publish {
        return Ok(());
    }
    let step = Job::Turn(TurnJob { session_id: session.to_string(), round });
    let next = Envelope { gen: report.gen, ..Envelope::new(turn_id.clone(), step, fleet_platform::now_ms()) };
    let topology = &cx.config.common.topology;
    publish_holding(cx, call, || cx.publisher.publish_job(topology, &next, trace_headers())).await?;
    let published = [(field::NEXT_PUBLISHED, round.to_string())];
    if let Err(e) = cx.store.executions().settle_owed(turn_id, &Owed::TurnNext, &published).await {
        tracing::debug!(error = %e, "the turn's next step is out but not marked so");
    }
    Ok(())
}
