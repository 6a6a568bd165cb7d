//! A tool call's side of its tool's circuit (endpoint health): before the claim the circuit admits
//! the call, lets it through as the interval's one probe, or defers it in the broker (no attempt
//! spent); after the attempt its endpoint signal is recorded, which opens or closes the circuit. A
//! probe that fails spends no attempt either: it is recorded in the call's history and the call is
//! deferred again. A turn's call of a tool whose circuit is open is not published at all: the
//! model is answered `tool_unavailable` at once (`unavailable_answer`, used by the fan-out), and a
//! turn's call already queued when the circuit opened is answered so too instead of waiting.

use std::time::Duration;

use serde_json::Value;

use fleet_platform::broker::Publisher;
use fleet_platform::now_ms;
use fleet_platform::store::{Admission, CancelRequest, Transition};
use fleet_protocol::circuit::{defer_wait, endpoint_signal, unavailable_result, Signal, MIN_DEFER, TOOL_UNAVAILABLE};
use fleet_protocol::envelope::{Envelope, Job, TurnParent};
use fleet_protocol::execution::{AttemptOutcome, AttemptRecord, ExecutionStatus};
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::turn::CallOutcome;

use crate::callback::{AttemptReport, AttemptVerdict};
use crate::process::Processor;
use crate::settle::{Held, Outcome};

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
pub(super) async fn admit(p: &Processor, publisher: &Publisher, envelope: &Envelope) -> Result<Gate, Outcome> {
    let Job::ToolCall(call) = &envelope.job else { return Ok(Gate::Pass) };
    // A circuit that never opens (threshold 0: the fleet's default and no field of the tool's)
    // costs no round trip: its state is not read. Its health is still recorded after the attempt.
    if let Ok(policies) = super::limits::policies_of(p, &call.tool_name).await {
        if p.config.circuit.for_tool(policies.circuit.as_ref()).failure_threshold == 0 {
            return Ok(Gate::Pass);
        }
    }
    let fallback = p.config.circuit.probe_interval;
    match p.store.admit_call(&call.tool_name, &envelope.execution_id, fallback).await {
        Ok(Admission::Call) => Ok(Gate::Pass),
        Ok(Admission::Probe) => {
            tracing::info!(tool = %call.tool_name, "circuit open; this call is the probe");
            p.metrics.circuit_events.with_label_values(&["probe"]).inc();
            Ok(Gate::Probe)
        }
        Ok(Admission::Wait { probe_free_in }) => {
            let wait = defer_wait(probe_free_in, fallback);
            if let Some(turn) = &call.parent {
                if let Some(answered) = answer_turn(p, publisher, envelope, turn, &call.tool_name).await {
                    return Err(answered);
                }
            }
            tracing::info!(tool = %call.tool_name, wait_ms = wait.as_millis() as u64, "circuit open; call deferred");
            p.metrics.circuit_events.with_label_values(&["deferred"]).inc();
            Err(Outcome::Parked(wait))
        }
        Err(e) => {
            tracing::debug!(error = %e, "circuit unknown (Redis unavailable); the claim decides");
            Ok(Gate::Pass)
        }
    }
}

/// After the attempt: records its endpoint signal. `Some` ends the job here: a probe that failed
/// retryably is recorded but not spent, and the call is deferred again.
pub(super) async fn after_attempt(
    p: &Processor,
    envelope: &Envelope,
    gate: Gate,
    report: &AttemptReport,
    record: &AttemptRecord,
    held: &Held,
) -> Option<Outcome> {
    let Job::ToolCall(call) = &envelope.job else { return None };
    let signal = endpoint_signal(report.http_status, report.class);
    let policy = match signal {
        // Only a failure needs the tool's own threshold and probe interval.
        Signal::Down => match super::limits::policies_of(p, &call.tool_name).await {
            Ok(policies) => p.config.circuit.for_tool(policies.circuit.as_ref()),
            Err(_) => p.config.circuit,
        },
        Signal::Up | Signal::Unknown => p.config.circuit,
    };
    match p.store.record_signal(&call.tool_name, signal, policy, now_ms()).await {
        Ok(Transition::Opened) => {
            tracing::warn!(tool = %call.tool_name, threshold = policy.failure_threshold, "circuit opened");
            p.metrics.circuit_events.with_label_values(&["opened"]).inc();
        }
        Ok(Transition::Closed) => {
            tracing::info!(tool = %call.tool_name, "circuit closed");
            p.metrics.circuit_events.with_label_values(&["closed"]).inc();
        }
        Ok(Transition::StillOpen | Transition::Unchanged) => {}
        Err(e) => tracing::debug!(error = %e, "endpoint health not recorded"),
    }
    let failed_probe =
        gate == Gate::Probe && signal == Signal::Down && matches!(report.verdict, AttemptVerdict::Retryable { .. });
    if !failed_probe {
        return None;
    }
    Some(probe_failed(p, envelope, record, held, policy.probe_interval).await)
}

/// A failed probe: in the call's history (its error says so), then the claim is given back and
/// the call deferred at the same attempt number.
async fn probe_failed(
    p: &Processor,
    envelope: &Envelope,
    record: &AttemptRecord,
    held: &Held,
    interval: Duration,
) -> Outcome {
    let error = record.error.as_deref().unwrap_or("failed");
    let record = AttemptRecord {
        outcome: AttemptOutcome::Retry,
        error: Some(format!("circuit probe failed (attempt not spent): {error}")),
        ..record.clone()
    };
    let id = &envelope.execution_id;
    let recorded =
        p.store.record_attempt(id, &record, ExecutionStatus::Retrying, None, now_ms(), Some(held.fence)).await;
    if let Ok(false) = recorded {
        return Outcome::Fenced;
    }
    if !p.release(held, "released").await {
        return Outcome::Fenced;
    }
    // A turn's call comes back soon, to be answered `tool_unavailable` rather than wait.
    let wait = if matches!(&envelope.job, Job::ToolCall(call) if call.parent.is_some()) {
        MIN_DEFER
    } else {
        defer_wait(None, interval)
    };
    Outcome::Parked(wait)
}

/// A turn's call that is queued while its tool's circuit is open: cancelled on its record (so no
/// copy of the job is ever sent: the record's scripts order this against an attempt's start), and
/// its turn answered `tool_unavailable`. `None`: the call is being sent or has ended elsewhere, so
/// it is deferred like any other and that copy tells the turn.
async fn answer_turn(
    p: &Processor,
    publisher: &Publisher,
    envelope: &Envelope,
    turn: &TurnParent,
    tool: &str,
) -> Option<Outcome> {
    match p.store.request_cancel(&envelope.execution_id, now_ms()).await {
        Ok(CancelRequest::Cancelled { .. }) => {}
        _ => return None,
    }
    let result = unavailable_answer(p, tool)
        .await
        .unwrap_or_else(|| unavailable_result(tool, None, p.config.circuit.probe_interval));
    let outcome = CallOutcome { ok: false, result };
    tracing::info!(tool, "circuit open; the turn's call is answered tool_unavailable, not sent");
    match super::parent::tool_call_finished(p, publisher, turn, tool, outcome).await {
        Ok(()) => Some(Outcome::Done(TOOL_UNAVAILABLE)),
        // The record is cancelled now: the next delivery comes back here and tells the turn again.
        Err(_) => Some(Outcome::Parked(MIN_DEFER)),
    }
}

/// For a turn's fan-out: the error result the model gets at once for a call of `tool` while its
/// circuit is open (`None`: closed, or Redis could not say, and the call is published).
pub(crate) async fn unavailable_answer(p: &Processor, tool: &str) -> Option<Value> {
    let health = p.store.tool_health(tool).await.ok()?;
    if !health.open {
        return None;
    }
    let opened_at = health.opened_at_ms.map(rfc3339_from_millis);
    Some(unavailable_result(tool, opened_at.as_deref(), p.config.circuit.probe_interval))
}
