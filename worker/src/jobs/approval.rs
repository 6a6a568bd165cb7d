//! Calls that wait for an operator's decision (issue 47). The step that makes such a call creates
//! its approval (once), tells the session (`approval_request`), and publishes the call's job to
//! wait in the broker until the approval's deadline: no worker holds the turn. A decision publishes
//! the same job at once. Whichever delivery claims the call first asks `approvals::call_gate`:
//! approved, it runs as it would have; refused, its turn gets seed 002's `failed` result and
//! nothing is sent; past its deadline undecided, the deadline decides it (a write conditional on
//! `pending`, so it never overrides an operator).

use fleet_platform::now_ms;
use fleet_platform::store::{ClaimAfter, DecideWrite, Fence, StoredApproval, Transition};
use fleet_protocol::approvals::{self, Approval, ApprovalPolicy, ApprovalStatus, CallGate, Decided};
use fleet_protocol::envelope::{Envelope, Job};
use fleet_protocol::execution::{field, ExecutionStatus};
use fleet_protocol::external_result::ExternalResult;
use fleet_protocol::life::Owed;
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::turn::{CallOutcome, PendingCall, TurnState};
use serde_json::Value;

use super::parent::{self, Parent};
use super::stream::emit;
use crate::context::Cx;
use crate::outcome::{Finished, HeldClaim, Outcome};

/// The approval settings of a call of `tool` (through `configuration`, if an agent configured
/// it): `Some` if it waits for an operator.
pub(crate) async fn policy(
    cx: &Cx<'_>,
    tool: &str,
    configuration: Option<&fleet_protocol::agent_config::ToolConfiguration>,
) -> Option<ApprovalPolicy> {
    let settings = match cx.tool(tool).await {
        Ok(Some(known)) => known.stored.approvals.clone(),
        _ => Default::default(),
    };
    approvals::needs_approval(&settings, configuration.map(|c| c.approval_settings()).as_ref())
}

/// What a call waiting for its decision is held with: its policy, the arguments the operator is
/// shown (masked), and for a client call what hands it to the client once approved.
pub(crate) struct HeldForApproval<'a> {
    pub policy: &'a ApprovalPolicy,
    pub parameters: &'a Value,
    pub client: Option<String>,
}

/// The call's job as it waits for its decision: it names its approval and is due at the deadline.
/// Creates the approval (and asks the session for a decision) unless a copy of this step did.
pub(crate) async fn hold(
    cx: &Cx<'_>,
    state: &TurnState,
    turn_id: &str,
    call: &PendingCall,
    held: HeldForApproval<'_>,
    mut envelope: Envelope,
) -> Result<Envelope, Outcome> {
    let HeldForApproval { policy, parameters, client } = held;
    let id = approvals::approval_id(&envelope.execution_id);
    if let Job::ToolCall(job) = &mut envelope.job {
        if let Some(parent) = job.parent.as_mut() {
            parent.approval = Some(id.clone());
        }
    }
    let now = now_ms();
    let deadline_ms = now + policy.timeout_secs as i64 * 1000;
    let approval = Approval {
        id: id.clone(),
        status: ApprovalStatus::Pending,
        tenant: state.tenant.clone(),
        session_id: state.session_id.clone(),
        turn_execution_id: turn_id.to_string(),
        call_execution_id: envelope.execution_id.clone(),
        call_id: call.call_id.clone(),
        tool_name: call.tool_name.clone(),
        tool_configuration_name: call.configuration.clone(),
        parameters: approvals::masked_parameters(parameters),
        effects: policy.effects.clone(),
        created_at: rfc3339_from_millis(now),
        deadline: rfc3339_from_millis(deadline_ms),
        timeout_outcome: policy.timeout_outcome,
        decided: None,
    };
    let job = String::from_utf8(envelope.to_bytes()).expect("an envelope is JSON");
    let stored = StoredApproval { approval, deadline_ms, job, client };
    let park = |e| {
        tracing::warn!(error = %e, "cannot record a call's approval; the step runs again");
        Outcome::Parked(cx.soon())
    };
    let deadline_ms = if cx.store.approvals().create(&stored, now).await.map_err(park)? {
        let event = approvals::approval_request_event(&stored.approval, &state.message_id);
        emit(cx, &state.session_id, event).await;
        deadline_ms
    } else {
        // A copy of the step: the approval it made stands, deadline and all.
        match cx.store.approvals().get(&id).await.map_err(park)? {
            Some(existing) => existing.deadline_ms,
            None => deadline_ms,
        }
    };
    Ok(Envelope { not_before_ms: Some(deadline_ms), ..envelope })
}

/// The gate of a claimed call that names an approval: `Ok` runs it (`Some`: an approved client
/// call, handed to its client instead, `hand_to_client`); `Err` is how its delivery ends instead
/// (refused and reported to its turn, or parked until its deadline).
pub(crate) async fn gate(
    cx: &Cx<'_>,
    envelope: &Envelope,
    parent: Option<&Parent<'_>>,
    held: HeldClaim,
) -> Result<Option<String>, Outcome> {
    let Some(parent) = parent else { return Ok(None) };
    let Some(id) = parent.turn.approval.as_deref() else { return Ok(None) };
    for _ in 0..2 {
        let read = cx.store.approvals().get(id).await;
        let Ok(found) = read else { return Err(super::claim::release_and_park(cx, envelope, held, cx.soon()).await) };
        let Some(stored) = found else {
            // Lost (it outlives its deadline by days): nobody approved it.
            tracing::warn!(approval = id, "the call's approval is gone; the call is refused");
            let refused = approvals::denied_result(&missing(parent, id), approvals::APPROVAL_TIMEOUT, None);
            return Err(refuse(cx, envelope, parent, held, refused).await);
        };
        match approvals::call_gate(&stored.approval, stored.deadline_ms, now_ms()) {
            CallGate::Run => return Ok(stored.client),
            CallGate::Refuse(result) => return Err(refuse(cx, envelope, parent, held, *result).await),
            CallGate::Wait(ms) => {
                let wait = std::time::Duration::from_millis(ms.max(0) as u64);
                return Err(super::claim::release_and_park(cx, envelope, held, wait).await);
            }
            CallGate::Expire => {
                let decided = Decided { by: "deadline".into(), at: rfc3339_from_millis(now_ms()), reason: None };
                match cx.store.approvals().decide(id, ApprovalStatus::TimedOut, &decided).await {
                    Ok(DecideWrite::Taken | DecideWrite::Already(_)) => continue,
                    Ok(DecideWrite::Missing) | Err(_) => {
                        return Err(super::claim::release_and_park(cx, envelope, held, cx.soon()).await)
                    }
                }
            }
        }
    }
    Err(super::claim::release_and_park(cx, envelope, held, cx.soon()).await)
}

/// An approval standing for one that is gone, enough to answer the call.
fn missing(parent: &Parent<'_>, id: &str) -> Approval {
    Approval {
        id: id.to_string(),
        status: ApprovalStatus::TimedOut,
        tenant: None,
        session_id: String::new(),
        turn_execution_id: parent.turn.turn_execution_id.clone(),
        call_execution_id: String::new(),
        call_id: parent.turn.call_id.clone(),
        tool_name: parent.tool_name.to_string(),
        tool_configuration_name: None,
        parameters: Value::Null,
        effects: vec![],
        created_at: String::new(),
        deadline: String::new(),
        timeout_outcome: Default::default(),
        decided: None,
    }
}

/// Ends a refused call under its claim: the record `failed` with seed 002's result and owing its
/// turn the report (one write), then the turn is told. Nothing is sent.
async fn refuse(
    cx: &Cx<'_>,
    envelope: &Envelope,
    parent: &Parent<'_>,
    held: HeldClaim,
    result: ExternalResult,
) -> Outcome {
    let error = result.error.as_ref().map(|e| format!("{}: {}", e.code, e.message)).unwrap_or_default();
    let kept = serde_json::to_string(&result).expect("a result serialises");
    let outcome = CallOutcome::structured(result);
    let done = Transition::new(ClaimAfter::Complete(&serde_json::Value::Null))
        .status(ExecutionStatus::Failed)
        .field(field::EXTERNAL_RESULT, kept)
        .last_error(&error)
        .owe(&Owed::Parent);
    let lease = cx.config.claim_lease;
    match cx.store.executions().transition(&envelope.execution_id, Fence::Token(held.token), lease, &done).await {
        Ok(true) => {}
        Ok(false) => return Outcome::Fenced,
        Err(e) => {
            tracing::warn!(error = %e, "cannot record the refused call; requeued");
            return Outcome::Requeue;
        }
    }
    tracing::info!("the call's approval refused it; nothing sent");
    match parent::tool_call_finished(cx, envelope, parent, outcome).await {
        Ok(()) => {
            crate::publish::retire(cx, envelope, &Owed::Parent).await;
            Outcome::Done(Finished::Refused)
        }
        Err(outcome) => outcome,
    }
}

/// An approved client call: the client is told of it (its `tool_output` is taken from now on), and
/// the job ends without a callback; the client's answer is the call's outcome.
pub(crate) async fn hand_to_client(
    cx: &Cx<'_>,
    envelope: &Envelope,
    session: &str,
    held: HeldClaim,
    release: &str,
) -> Outcome {
    let Ok(release) = serde_json::from_str::<Value>(release) else { return Outcome::Done(Finished::Success) };
    let event_id = release["event_id"].as_str().unwrap_or_default().to_string();
    let Ok(call) = serde_json::from_value::<fleet_protocol::agent_session::ClientCall>(release["call"].clone()) else {
        return Outcome::Done(Finished::Success);
    };
    if cx.store.sessions().put_client_calls(session, &[(event_id.clone(), call)]).await.is_err() {
        return super::claim::release_and_park(cx, envelope, held, cx.soon()).await;
    }
    emit(cx, session, release["event"].clone()).await;
    let result = serde_json::json!({"handed_to_client": event_id});
    let done = Transition::new(ClaimAfter::Complete(&result)).status(ExecutionStatus::Succeeded);
    let lease = cx.config.claim_lease;
    match cx.store.executions().transition(&envelope.execution_id, Fence::Token(held.token), lease, &done).await {
        Ok(true) => Outcome::Done(Finished::Success),
        Ok(false) => Outcome::Fenced,
        Err(_) => Outcome::Requeue,
    }
}
