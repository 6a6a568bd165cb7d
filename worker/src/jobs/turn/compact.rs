//! A compaction (seed 001) is a turn of its session, in its line like any other: under the
//! session's lock it reads the remembered history, has the session's model summarise the oldest
//! whole exchanges (nothing streamed), saves the summary with the finish owed (one write), then
//! rewrites the history (once, only while it holds the session), gives the session on, and only
//! then tells the client (`compaction`, `done`). A worker lost in between leaves the rest owed.

use serde_json::json;

use fleet_platform::now_ms;
use fleet_platform::store::{ClaimAfter, CompactHistory, Fence, Transition};
use fleet_protocol::agent_session;
use fleet_protocol::compaction::{self, Compaction, Done, Report};
use fleet_protocol::envelope::Envelope;
use fleet_protocol::life::Owed;
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::turn::{self, Message, TurnState};

use super::model::{self, Purpose};
use super::session::wake;
use super::{emit, ClaimedStep};
use crate::context::Cx;
use crate::outcome::{Finished, Outcome};
use crate::publish::retire;

pub(super) async fn compact(step: &ClaimedStep<'_>, state: &mut TurnState) -> Outcome {
    summarise(step, state).await.unwrap_or_else(|stop| stop)
}

async fn summarise(step: &ClaimedStep<'_>, state: &mut TurnState) -> Result<Outcome, Outcome> {
    let cx = &step.cx;
    let asked: Compaction = state.compaction.clone().unwrap_or_default();
    let Ok(history) = cx.store.sessions().history(&state.session_id).await else {
        return Err(step.release_and_park().await);
    };
    let summary_key = compaction::summary_key(step.turn_id());
    let plan = compaction::plan(&history, asked.up_to_turn.as_deref(), asked.keep_recent);
    let mut record = None;
    let done = match plan {
        None => Done {
            up_to_seq: None,
            report: Report { turns_compacted: 0, events_compacted: 0, summary_text: None, summary_key },
        },
        Some(plan) => {
            let prompt = asked.prompt.as_deref().unwrap_or(compaction::DEFAULT_PROMPT);
            state.conversation = vec![Message::text("system", prompt), Message::text("user", &plan.transcript)];
            let reserved = model::reserve(step, state, Purpose::Summary, None).await?;
            // Nothing of a summary streams, and its state is saved after it.
            let ready = std::future::ready(true);
            let (completion, attempt) =
                model::call(step, state, Purpose::Summary, reserved, &Default::default(), ready).await?;
            model::add_usage(state, &completion);
            record = Some(attempt);
            let report = Report {
                turns_compacted: plan.turns,
                events_compacted: plan.entries,
                summary_text: Some(completion.content),
                summary_key,
            };
            Done { up_to_seq: Some(plan.up_to_seq), report }
        }
    };
    state.compaction = Some(Compaction { done: Some(done), ..asked });
    state.round += 1;
    let mut saved =
        Transition::new(ClaimAfter::Keep).step(step.envelope.step().next_round()).owe(&Owed::TurnFinish).turn(state);
    if let Some(record) = &record {
        saved = saved.attempt(record);
    }
    step.write(&saved).await?;
    complete(cx, step.envelope, state, Fence::Token(step.held.token)).await
}

/// The finish a saved summary owes (see `finish::complete`): the history rewritten, the session
/// given on (turns that steered into the compaction run on their own, first in line), the next
/// turn woken, the record `succeeded`, then the announcement.
pub(super) async fn complete(
    cx: &Cx<'_>,
    envelope: &Envelope,
    state: &TurnState,
    fence: Fence<'_>,
) -> Result<Outcome, Outcome> {
    let turn_id = &envelope.execution_id;
    let session = &state.session_id;
    let Some(done) = state.compaction.as_ref().and_then(|c| c.done.as_ref()) else { return Ok(Outcome::Copy) };
    let lock_fence = match fence {
        Fence::Token(token) => token,
        Fence::Owed(_) => u64::MAX,
    };
    if let (Some(up_to), Some(text)) = (done.up_to_seq, &done.report.summary_text) {
        let summary = compaction::summary_entry(turn_id, text, &rfc3339_from_millis(now_ms()));
        match cx.store.sessions().session_compact(session, turn_id, lock_fence, up_to, &summary).await {
            Ok(CompactHistory::Done) => {}
            Ok(CompactHistory::NotHolder) => return Err(Outcome::Fenced),
            Err(_) => return Err(Outcome::Parked(cx.soon())),
        }
    }
    let next = cx.store.sessions().session_abandon(session, turn_id).await.map_err(|_| Outcome::Parked(cx.soon()))?;
    if let Some(next) = next {
        wake(cx, envelope, &next, session).await?;
    }
    super::succeed(cx, turn_id, fence, &json!({"compaction": done.report})).await?;
    announce(cx, envelope, state, &done.report).await
}

/// A finished compaction's `compaction` and `done` events, sent after its record says `succeeded`.
pub(super) async fn announce(
    cx: &Cx<'_>,
    envelope: &Envelope,
    state: &TurnState,
    report: &Report,
) -> Result<Outcome, Outcome> {
    emit(cx, &state.session_id, agent_session::compaction_event(report, &state.message_id)).await;
    emit(cx, &state.session_id, turn::done_event(&state.message_id)).await;
    retire(cx, envelope, &Owed::Announce).await;
    Ok(Outcome::Done(Finished::Success))
}
