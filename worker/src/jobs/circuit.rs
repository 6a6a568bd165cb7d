//! A tool call's side of its tool's circuit (endpoint health): before the claim the circuit admits
//! the call, lets it through as the interval's one probe, or defers it in the broker (no attempt
//! spent); after the attempt its endpoint signal is recorded, which opens or closes the circuit. A
//! probe that fails spends no attempt either: it is recorded in the call's history and the call is
//! deferred again. A turn's call of a tool whose circuit is open is not published at all: the
//! model is answered `tool_unavailable` at once (`unavailable_answer`, used by the fan-out), and a
//! turn's call already queued when the circuit opened is answered so too instead of waiting.

use std::time::Duration;

use serde_json::Value;

use fleet_platform::now_ms;
use fleet_platform::store::{CancelRequest, CircuitAdmission, CircuitChange, ClaimAfter, Fence, Transition};
use fleet_protocol::circuit::{defer_wait, endpoint_signal, unavailable_result, Signal, MIN_DEFER};
use fleet_protocol::envelope::{Envelope, Job};
use fleet_protocol::execution::{AttemptOutcome, AttemptRecord, ExecutionStatus};
use fleet_protocol::sanitize::sanitize_error;
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::turn::CallOutcome;

use super::parent::Parent;
use crate::callback::{AttemptReport, AttemptVerdict};
use crate::context::Cx;
use crate::outcome::{Finished, HeldClaim, Outcome};

/// How a call passed its tool's circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gate {
    /// Closed (or not a tool call, or Redis could not say: the claim decides then).
    Pass,
    /// The circuit is open and this call is its probe.
    Probe,
}

/// Before the claim: `Err` is how the job ends instead: deferred while the circuit is open, or,
/// for a turn's call, answered `tool_unavailable` (the turn does not wait for the endpoint).
pub(super) async fn admit(cx: &Cx<'_>, envelope: &Envelope) -> Result<Gate, Outcome> {
    let call = match &envelope.job {
        Job::ToolCall(call) => call,
        // Only a tool has an endpoint with a circuit.
        Job::Webhook(_) | Job::Turn(_) => return Ok(Gate::Pass),
    };
    // A circuit that never opens (threshold 0: the fleet's default and no field of the tool's)
    // costs no round trip: its state is not read. Its health is still recorded after the attempt.
    let mut fallback = cx.config.circuit.probe_interval;
    if let Ok(policies) = cx.policies_of(&call.tool_name).await {
        let circuit = cx.config.circuit.for_tool(policies.circuit.as_ref());
        if circuit.failure_threshold == 0 {
            return Ok(Gate::Pass);
        }
        // The tool's own interval: a deferral never waits longer than one of its probes.
        fallback = circuit.probe_interval;
    }
    match cx.store.limits().admit_call(&call.tool_name, &envelope.execution_id, fallback).await {
        Ok(CircuitAdmission::Call) => Ok(Gate::Pass),
        Ok(CircuitAdmission::Probe) => {
            tracing::info!(tool = %call.tool_name, "circuit open; this call is the probe");
            cx.metrics.circuit_events.with_label_values(&["probe"]).inc();
            Ok(Gate::Probe)
        }
        Ok(CircuitAdmission::Wait { probe_free_in }) => {
            let wait = defer_wait(probe_free_in, fallback);
            if let Some(turn) = &call.parent {
                let parent = Parent { turn, tool_name: &call.tool_name, session_id: call.room_id.as_deref() };
                if let Some(answered) = answer_turn(cx, envelope, &parent).await {
                    return Err(answered);
                }
            }
            tracing::info!(tool = %call.tool_name, wait_ms = wait.as_millis() as u64, "circuit open; call deferred");
            cx.metrics.circuit_events.with_label_values(&["deferred"]).inc();
            Err(Outcome::Parked(wait))
        }
        Err(e) => {
            tracing::debug!(error = %e, "circuit unknown (Redis unavailable); the claim decides");
            Ok(Gate::Pass)
        }
    }
}

/// After the attempt: records its endpoint signal. `Err` ends the job here: a probe that failed
/// retryably is recorded but not spent, and the call is deferred again.
pub(super) async fn after_attempt(
    cx: &Cx<'_>,
    envelope: &Envelope,
    gate: Gate,
    report: &AttemptReport,
    record: &AttemptRecord,
    held: HeldClaim,
) -> Result<(), Outcome> {
    let call = match &envelope.job {
        Job::ToolCall(call) => call,
        Job::Webhook(_) | Job::Turn(_) => return Ok(()),
    };
    let signal = endpoint_signal(report.http_status, report.class);
    let policy = match signal {
        // Only a failure needs the tool's own threshold and probe interval.
        Signal::Down => match cx.policies_of(&call.tool_name).await {
            Ok(policies) => cx.config.circuit.for_tool(policies.circuit.as_ref()),
            Err(_) => cx.config.circuit,
        },
        Signal::Up | Signal::Unknown => cx.config.circuit,
    };
    if !worth_recording(cx, &call.tool_name, signal).await {
        return Ok(());
    }
    // What the circuit's history says opened it (only a failure can).
    let error = match signal {
        Signal::Down => sanitize_error(record.error.as_deref().unwrap_or(report.class)),
        Signal::Up | Signal::Unknown => String::new(),
    };
    match cx.store.limits().record_signal(&call.tool_name, signal, policy, now_ms(), &error).await {
        Ok(CircuitChange::Opened) => {
            tracing::warn!(tool = %call.tool_name, threshold = policy.failure_threshold, "circuit opened");
            cx.metrics.circuit_events.with_label_values(&["opened"]).inc();
        }
        Ok(CircuitChange::Closed) => {
            tracing::info!(tool = %call.tool_name, "circuit closed");
            cx.metrics.circuit_events.with_label_values(&["closed"]).inc();
        }
        Ok(CircuitChange::StillOpen | CircuitChange::Unchanged) => {}
        Err(e) => tracing::debug!(error = %e, "endpoint health not recorded"),
    }
    let failed_probe =
        gate == Gate::Probe && signal == Signal::Down && matches!(report.verdict, AttemptVerdict::Retryable { .. });
    if !failed_probe {
        return Ok(());
    }
    Err(probe_failed(cx, envelope, record, held, policy.probe_interval).await)
}

/// Whether a signal is worth a write: every failure is, and every success of a tool whose circuit
/// can open (it resets the failure count other workers built); a success of a tool whose circuit
/// never opens only keeps its health view fresh, at most once a second per worker.
async fn worth_recording(cx: &Cx<'_>, tool: &str, signal: Signal) -> bool {
    if signal != Signal::Up {
        return true;
    }
    let can_open = match cx.policies_of(tool).await {
        Ok(policies) => cx.config.circuit.for_tool(policies.circuit.as_ref()).failure_threshold > 0,
        Err(_) => true,
    };
    can_open || cx.health_writes.due(tool)
}

/// A failed probe: in the call's history (its error says so), then the claim is given back and
/// the call deferred at the same attempt number.
async fn probe_failed(
    cx: &Cx<'_>,
    envelope: &Envelope,
    record: &AttemptRecord,
    held: HeldClaim,
    interval: Duration,
) -> Outcome {
    let error = record.error.as_deref().unwrap_or("failed");
    let record = AttemptRecord {
        outcome: AttemptOutcome::Retry,
        error: Some(format!("circuit probe failed (attempt not spent): {error}")),
        ..record.clone()
    };
    let deferred = Transition::new(ClaimAfter::Release("released")).status(ExecutionStatus::Retrying).attempt(&record);
    let lease = cx.config.claim_lease;
    if let Ok(false) =
        cx.store.executions().transition(&envelope.execution_id, Fence::Token(held.token), lease, &deferred).await
    {
        return Outcome::Fenced;
    }
    // A turn's call comes back soon, to be answered `tool_unavailable` rather than wait.
    let for_a_turn = match &envelope.job {
        Job::ToolCall(call) => call.parent.is_some(),
        Job::Webhook(_) | Job::Turn(_) => false,
    };
    Outcome::Parked(if for_a_turn { MIN_DEFER } else { defer_wait(None, interval) })
}

/// A turn's call that is queued while its tool's circuit is open: cancelled on its record (so no
/// copy of the job is ever sent: the record's scripts order this against an attempt's start), and
/// its turn answered `tool_unavailable`. `None`: the call is being sent or has ended elsewhere, so
/// it is deferred like any other and that copy tells the turn.
async fn answer_turn(cx: &Cx<'_>, envelope: &Envelope, parent: &Parent<'_>) -> Option<Outcome> {
    match cx.store.executions().request_cancel(&envelope.execution_id, now_ms()).await {
        Ok(CancelRequest::Cancelled { .. }) => {}
        _ => return None,
    }
    let tool = parent.tool_name;
    let result = unavailable_answer(cx, tool)
        .await
        .unwrap_or_else(|| unavailable_result(tool, None, cx.config.circuit.probe_interval));
    tracing::info!(tool, "circuit open; the turn's call is answered tool_unavailable, not sent");
    match super::parent::tool_call_finished(cx, envelope, parent, CallOutcome { ok: false, result, external: None })
        .await
    {
        Ok(()) => Some(Outcome::Done(Finished::ToolUnavailable)),
        // The record is cancelled now: the next delivery tells the turn again.
        Err(outcome) => Some(outcome),
    }
}

/// For a turn's fan-out: the error result the model gets at once for a call of `tool` while its
/// circuit is open (`None`: closed, or Redis could not say, and the call is published).
pub(crate) async fn unavailable_answer(cx: &Cx<'_>, tool: &str) -> Option<Value> {
    let health = cx.store.limits().tool_health(tool).await.ok()?;
    if !health.open {
        return None;
    }
    let opened_at = health.opened_at_ms.map(rfc3339_from_millis);
    Some(unavailable_result(tool, opened_at.as_deref(), cx.config.circuit.probe_interval))
}
