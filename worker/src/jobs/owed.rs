//! A copy of an earlier step that finds the record owing something carries it out instead of
//! running: a worker died between a transition and what the transition owed.

use serde_json::Value;

use fleet_protocol::envelope::{Envelope, Job, ToolCallJob};
use fleet_protocol::life::Owed;
use fleet_protocol::turn::CallOutcome;

use super::parent::Parent;
use crate::context::Cx;
use crate::outcome::{DeadLetter, Finished, Outcome};
use crate::publish::{publish_next, retire};

pub(crate) async fn carry(cx: &Cx<'_>, envelope: &Envelope, owed: Owed, result: Option<Value>) -> Outcome {
    tracing::info!(owed = owed.label(), "a copy of an earlier step carries out what the record owes");
    cx.metrics.duplicate_deliveries.with_label_values(&[envelope.kind().as_str()]).inc();
    match &owed {
        Owed::Next { envelope: next } => {
            if let Err(settle) = publish_next(cx, next).await {
                return settle.into();
            }
            retire(cx, envelope, &owed).await;
            Outcome::Done(Finished::Owed)
        }
        Owed::Settle { verdict } => Outcome::DeadLetter(DeadLetter {
            reason: verdict.reason,
            error: verdict.error.clone(),
            record: None,
            held: None,
            code: None,
        }),
        Owed::Parent => match &envelope.job {
            Job::ToolCall(call) => report_to_parent(cx, envelope, call, result.unwrap_or(Value::Null)).await,
            // Only a turn's call owes its turn a report.
            Job::Webhook(_) | Job::Turn(_) => Outcome::Copy,
        },
        Owed::TurnCalls | Owed::TurnNext | Owed::TurnFinish | Owed::Announce => match &envelope.job {
            Job::Turn(_) => super::turn::carry(cx, envelope, &owed).await,
            // Only a turn's record owes these.
            Job::ToolCall(_) | Job::Webhook(_) => Outcome::Copy,
        },
    }
}

/// A turn's call that ended but whose turn may not have heard: it is told again (its outcome
/// is recorded once; only the report that completes the round publishes the next step). A call
/// that ended with a structured result is told that result, read back from its record.
async fn report_to_parent(cx: &Cx<'_>, envelope: &Envelope, call: &ToolCallJob, result: Value) -> Outcome {
    let Some(turn) = &call.parent else { return Outcome::Copy };
    let parent = Parent { turn, tool_name: &call.tool_name, session_id: call.room_id.as_deref() };
    let outcome = match cx.store.executions().get_execution(&envelope.execution_id).await {
        Ok(Some(view)) => match view.external_result {
            Some(external) => CallOutcome::structured(external),
            None => CallOutcome { ok: true, result, external: None },
        },
        Ok(None) => CallOutcome { ok: true, result, external: None },
        Err(_) => return Outcome::Parked(cx.soon()),
    };
    if let Err(outcome) = super::parent::tool_call_finished(cx, envelope, &parent, outcome).await {
        return outcome;
    }
    retire(cx, envelope, &Owed::Parent).await;
    Outcome::Done(Finished::Owed)
}
