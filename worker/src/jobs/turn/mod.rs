//! An agent turn's step (one model call) as a linear pipeline: claim the step, take the session,
//! gather what the model must see (history, tool results, steers), call the model with the claim
//! renewed, then fan the tool calls out or finish. Every write of the turn after the claim carries
//! the claim's token (the turn's state and record in their slot, the session's lock in its own),
//! and nothing the turn needs next is acked away before it is durable.

mod budget;
mod compact;
mod fanout;
mod finish;
mod gather;
mod images;
mod model;
mod session;

use std::future::Future;
use std::pin::Pin;

use fleet_platform::now_ms;
use fleet_platform::store::{ClaimAfter, Fence, Opened, Transition};
use fleet_protocol::dead_letters::DeadLetterReason;
use fleet_protocol::envelope::{Envelope, TurnJob};
use fleet_protocol::execution::ExecutionStatus;
use fleet_protocol::life::Owed;
use fleet_protocol::turn::{self, TurnState};

use super::claim::{self, Claim, Mode};
pub(super) use super::stream::emit;
use crate::context::Cx;
use crate::outcome::{DeadLetter, Finished, HeldClaim, Outcome};
use crate::publish::retrying_redis;

pub(super) use finish::abandon;

/// One claimed step of a turn: what its stages share.
pub(super) struct ClaimedStep<'a> {
    pub cx: Cx<'a>,
    pub envelope: &'a Envelope,
    pub job: &'a TurnJob,
    pub held: HeldClaim,
}

impl ClaimedStep<'_> {
    fn turn_id(&self) -> &str {
        &self.envelope.execution_id
    }

    /// The provider, model and answer bound a model call of the turn uses (its budget is the
    /// provider's, and its request names the model).
    fn target(&self, state: &TurnState) -> (String, String, u32) {
        let (cx, config) = (&self.cx, &state.assistant.model_config);
        let provider = config.provider.clone().unwrap_or_else(|| cx.config.common.llm.default_provider.clone());
        let model = config.model.clone().unwrap_or_else(|| cx.llm.default_model().to_string());
        (provider, model, config.max_tokens.unwrap_or(cx.config.llm_max_tokens))
    }

    /// Writes `transition` under the step's claim; `Err` is how the step ends: fenced off by a
    /// newer claim, or parked (Redis unavailable, the claim given back).
    async fn write(&self, transition: &Transition<'_>) -> Result<(), Outcome> {
        let lease = self.cx.config.claim_lease;
        match self
            .cx
            .store
            .executions()
            .transition(self.turn_id(), Fence::Token(self.held.token), lease, transition)
            .await
        {
            Ok(true) => Ok(()),
            Ok(false) => Err(Outcome::Fenced),
            Err(e) => {
                tracing::warn!(error = %e, "cannot write the turn's step; parked");
                Err(self.release_and_park().await)
            }
        }
    }

    /// Gives the claim back and parks the step: something it needs failed before its model call,
    /// or its session is busy (a copy may park beside it: the session's wake is such a copy).
    async fn release_and_park(&self) -> Outcome {
        self.release().await;
        Outcome::Parked(self.cx.soon())
    }

    /// Gives the claim back and parks the step for `wait` (its provider's budget or its tenant's
    /// turn slots have no room yet). The park is this claim's: once published, it marks the
    /// record, and a copy of the step arriving meanwhile is only acked.
    async fn release_and_park_for(&self, wait: std::time::Duration) -> Outcome {
        if self.release().await {
            Outcome::ParkedStep(wait, self.held.token)
        } else {
            Outcome::Parked(wait)
        }
    }

    /// Answers call `key` of the answer made in `round` at once (a built-in tool's, or a refused
    /// call): its outcome is recorded as a tool's result would be (the first one wins); Redis
    /// unavailable, the step is parked.
    async fn answer_now(&self, key: &str, round: u32, outcome: &turn::CallOutcome) -> Result<(), Outcome> {
        match self.cx.store.sessions().record_call_outcome(self.turn_id(), key, outcome, round + 1).await {
            Ok(_) => Ok(()),
            Err(_) => Err(self.release_and_park().await),
        }
    }

    /// Gives the step's claim back; `false` if that was not written (fenced, Redis unavailable).
    async fn release(&self) -> bool {
        let released = Transition::new(ClaimAfter::Release("released"));
        let lease = self.cx.config.claim_lease;
        matches!(
            self.cx
                .store
                .executions()
                .transition(self.turn_id(), Fence::Token(self.held.token), lease, &released)
                .await,
            Ok(true)
        )
    }
}

pub(super) async fn run(cx: &Cx<'_>, envelope: &Envelope, job: &TurnJob) -> Outcome {
    pipeline(cx, envelope, job).await.unwrap_or_else(|stop| stop)
}

async fn pipeline(cx: &Cx<'_>, envelope: &Envelope, job: &TurnJob) -> Result<Outcome, Outcome> {
    let (held, cancel_requested, read) = match claim::admit(cx, envelope, Mode::Hold).await? {
        Claim::Step { held, cancel_requested, turn } => (held, cancel_requested, turn),
        Claim::Owed { owed, result } => return Err(Outcome::Owed(owed, result)),
        // A turn's cancel ends it at its step; a later copy finds it cancelled.
        Claim::Cancelled => return Err(Outcome::Copy),
    };
    let step = ClaimedStep { cx: *cx, envelope, job, held };
    let mut state = match read {
        Some(state) => *state,
        None => load(&step).await?,
    };
    if cancel_requested {
        return Ok(finish::cancel(&step, &state).await);
    }
    // A provider without a budget is asked for its pause meanwhile: that only reads.
    let (opened, ahead) = tokio::join!(session::take(&step, &state), budget::ask_ahead(&step, &state));
    let opened = opened?;
    if state.round >= cx.config.max_rounds {
        let error = format!("the turn took more than {} model rounds", cx.config.max_rounds);
        let dead = DeadLetter {
            reason: DeadLetterReason::Permanent,
            error,
            record: None,
            held: Some(held),
            code: Some("max_rounds"),
        };
        return Err(Outcome::DeadLetter(dead));
    }
    budget::within_tenant_cap(&step, state.tenant.as_deref()).await?;
    let slot = budget::take_turn_slot(&step, &state).await?;
    // Pinned here and lent to the slot's renewals: passed on by value, the step's work would be
    // laid out again in each future it passes through (the compiler does not overlap the two).
    let work = std::pin::pin!(model_step(&step, &mut state, opened, ahead));
    budget::holding_turn_slot(cx, slot, work).await
}

/// The step's model call (a compaction's or the turn's) and what follows from its answer.
async fn model_step(
    step: &ClaimedStep<'_>,
    state: &mut TurnState,
    opened: Opened,
    ahead: Option<budget::Ahead>,
) -> Result<Outcome, Outcome> {
    if state.compaction.is_some() {
        return Ok(compact::compact(step, state).await);
    }
    let taken = gather::collect(step, state, opened).await?;
    // Before any budget is taken: a prompt that cannot fit would spend it on a call bound to fail.
    if let Some(over) = model::overflow(step, state).await {
        return Ok(finish::overflow(step, over).await);
    }
    let shown = images::Shown::read(step, state).await?;
    let reserved = model::reserve(step, state, model::Purpose::Answer, ahead).await?;
    let abandoned = gather::prepare(step, state);
    let (unanswered, called) = {
        // Lent, not passed: passed by value, the save would be laid out twice in the call's future.
        let save = std::pin::pin!(gather::begin(step, state, taken, abandoned));
        call_beside_save(save, |gate| {
            model::call(step, state, model::Purpose::Answer, reserved, &shown, async { gate.await.is_ok() })
        })
        .await?
    };
    state.steers_unanswered = unanswered;
    let (completion, record) = called?;
    model::add_usage(state, &completion);
    model::show_reasoning(&step.cx, state, &completion).await;
    Ok(if completion.tool_calls.is_empty() {
        finish::finish(step, state, completion, record).await
    } else {
        fanout::fan_out(step, state, completion, record).await
    })
}

/// Runs a model call (`call`, given its gate) beside the save of the state it needs (`save`): the
/// request goes out at once, the gate opens only once the save has succeeded (nothing of the call
/// streams before), and a save that fails drops the call, cancelling its request. The call is
/// pinned here, where it is made, and polled through the save and after it.
async fn call_beside_save<T, E, C: Future>(
    save: impl Future<Output = Result<T, E>>,
    call: impl FnOnce(tokio::sync::oneshot::Receiver<()>) -> C,
) -> Result<(T, C::Output), E> {
    let (saved, gate) = tokio::sync::oneshot::channel();
    let mut call = std::pin::pin!(call(gate));
    let (save_result, early) = beside(save, call.as_mut()).await;
    let kept = save_result?;
    let _ = saved.send(());
    let called = match early {
        Some(called) => called,
        None => call.await,
    };
    Ok((kept, called))
}

/// Runs `first` to its end while `second` makes progress beside it (`first` is polled first);
/// `second`'s output too if it ended before.
async fn beside<A: Future, B: Future>(first: A, mut second: Pin<&mut B>) -> (A::Output, Option<B::Output>) {
    let mut first = std::pin::pin!(first);
    let mut early = None;
    loop {
        tokio::select! {
            biased;
            out = &mut first => return (out, early),
            out = second.as_mut(), if early.is_none() => early = Some(out),
        }
    }
}

/// The turn's state when its claim did not read it (one saved where states were kept before, or
/// one that does not parse: reported here); a turn whose state is gone has nothing left to run.
async fn load(step: &ClaimedStep<'_>) -> Result<TurnState, Outcome> {
    match step.cx.store.sessions().load_turn(step.turn_id()).await {
        Ok(Some(state)) => Ok(state),
        Ok(None) => {
            tracing::warn!("the turn's state is gone; the step does nothing");
            Err(Outcome::Done(Finished::Duplicate))
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the turn's state; parked");
            Err(step.release_and_park().await)
        }
    }
}

/// What a turn's record owes, carried out by a copy of an earlier step.
pub(super) async fn carry(cx: &Cx<'_>, envelope: &Envelope, owed: &Owed) -> Outcome {
    let turn_id = &envelope.execution_id;
    let state = match cx.store.sessions().load_turn(turn_id).await {
        Ok(Some(state)) => state,
        Ok(None) => return Outcome::Copy,
        Err(_) => return Outcome::Parked(cx.soon()),
    };
    let carried = match owed {
        Owed::TurnCalls => fanout::publish_owed(cx, envelope, &state).await,
        Owed::TurnNext => fanout::publish_next_step(cx, envelope, &state).await,
        Owed::TurnFinish => finish::complete(cx, envelope, &state, Fence::Owed(owed)).await,
        Owed::Announce => finish::announce(cx, envelope, &state).await,
        // A callback's owed work: not a turn's record's.
        Owed::Next { .. } | Owed::Settle { .. } | Owed::Parent => Ok(Outcome::Copy),
    };
    carried.unwrap_or_else(|stop| stop)
}

/// The record says `succeeded` with `result`, owing the announcement (under a lease, so a copy
/// arriving meanwhile leaves it to the step making it).
pub(super) async fn succeed(
    cx: &Cx<'_>,
    turn_id: &str,
    fence: Fence<'_>,
    result: &serde_json::Value,
) -> Result<(), Outcome> {
    let owed_until = now_ms() + cx.config.claim_lease.as_millis() as i64;
    let succeeded = Transition::new(ClaimAfter::Complete(result))
        .status(ExecutionStatus::Succeeded)
        .owe(&Owed::Announce)
        .field(fleet_protocol::execution::field::OWED_UNTIL, owed_until);
    match cx.store.executions().transition(turn_id, fence, cx.config.claim_lease, &succeeded).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(Outcome::Fenced),
        // A write whose answer timed out may have landed: then the announcement it owes is this
        // step's to make now (a copy would wait out the lease the write gave it).
        Err(e) => {
            let landed = || cx.store.executions().wrote_owing(turn_id, ExecutionStatus::Succeeded, owed_until);
            match retrying_redis(cx.config.claim_lease / 3, landed).await {
                Ok(true) => Ok(()),
                _ => {
                    tracing::warn!(error = %e, "cannot mark the turn succeeded; parked");
                    Err(Outcome::Parked(cx.soon()))
                }
            }
        }
    }
}

/// Before a model call is retried: the client drops the abandoned attempt's tokens.
pub(super) async fn announce_retry(cx: &Cx<'_>, envelope: &Envelope, job: &TurnJob, error: &str) {
    let Ok(Some(state)) = cx.store.sessions().load_turn(&envelope.execution_id).await else { return };
    let event = turn::retry_event(&state.message_id, envelope.attempt, "llm_retry", error);
    emit(cx, &job.session_id, event).await;
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::pin::pin;
    use std::time::Duration;

    use super::{beside, call_beside_save};

    /// Sets its flag when dropped.
    struct SetOnDrop<'a>(&'a Cell<bool>);

    impl Drop for SetOnDrop<'_> {
        fn drop(&mut self) {
            self.0.set(true);
        }
    }

    /// A save that fails drops the call before its gate opens: nothing of it streams, and its
    /// request is cancelled.
    #[tokio::test]
    async fn a_failed_save_drops_the_call_before_its_gate_opens() {
        let (dropped, passed_gate) = (Cell::new(false), Cell::new(false));
        let save = async {
            tokio::task::yield_now().await;
            Err::<(), _>("fenced")
        };
        let out = call_beside_save(save, |gate| async {
            let _guard = SetOnDrop(&dropped);
            if gate.await.is_ok() {
                passed_gate.set(true);
            }
        })
        .await;
        assert_eq!(out, Err("fenced"));
        assert!(dropped.get(), "the call was dropped");
        assert!(!passed_gate.get(), "the call never passed its gate");
    }

    /// The call starts while its state is still being saved, and passes its gate only once the
    /// save has ended.
    #[tokio::test(start_paused = true)]
    async fn the_call_starts_before_the_save_ends_and_streams_after_it() {
        let saved = Cell::new(false);
        let save = async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            saved.set(true);
            Ok::<_, ()>("saved")
        };
        let out = call_beside_save(save, |gate| async {
            let started_before = !saved.get();
            let open = gate.await.is_ok();
            (started_before, open, saved.get())
        })
        .await;
        assert_eq!(out, Ok(("saved", (true, true, true))), "started before, gate open, and only after the save");
    }

    /// A call that ends before its save (its lease lost) is kept for the step, once the save ended.
    #[tokio::test(start_paused = true)]
    async fn a_call_ending_before_the_save_is_kept() {
        let save = async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok::<_, ()>("saved")
        };
        assert_eq!(call_beside_save(save, |_gate| async { 7 }).await, Ok(("saved", 7)));
    }

    /// The first is polled first: its write is queued before the second's request.
    #[tokio::test]
    async fn the_first_is_polled_first() {
        let order = std::sync::Mutex::new(Vec::new());
        let mut second = pin!(async {
            order.lock().unwrap().push("second");
        });
        let first = async {
            order.lock().unwrap().push("first");
            tokio::task::yield_now().await;
        };
        let _ = beside(first, second.as_mut()).await;
        assert_eq!(*order.lock().unwrap(), ["first", "second"]);
    }
}
