//! A model call against its provider's fleet-wide budget: before the call the step reserves its
//! estimate (one request, its prompt and `max_tokens`) or is parked until its slot, giving its
//! claim back (no worker slot held, no attempt spent, nothing written), exactly as a tool's rate
//! limit defers a call; after it, the reservation is settled with the tokens the provider reported,
//! and a 429 pauses the provider for every worker. A provider without a budget is still checked
//! for a pause, beside the session's take (the check only reads).

use std::future::Future;
use std::time::Duration;

use fleet_platform::store::{Pace, Semaphore, Spend, StoreError, Waiter};
use fleet_protocol::budget::{pause_after_429, Bucket, ProviderLimits, Unit};
use fleet_protocol::fair::{self, Priority};
use fleet_protocol::retry::EARLY_RETURN_TOLERANCE;
use fleet_protocol::turn::TurnState;

use super::ClaimedStep;
use crate::context::Cx;
use crate::jobs::limits;
use crate::outcome::{DeadLetter, Outcome};
use fleet_protocol::dead_letters::DeadLetterReason;

/// What a step took from its provider's budget for its call.
pub(super) struct BudgetReservation {
    pub provider: String,
    pub buckets: Vec<Bucket>,
    pub tokens: u64,
    /// Whose call it is: a fallback provider's budget counts it for the same tenant.
    pub tenant: String,
}

/// Why a step was parked before its model call: the `reason` of `fleet_llm_budget_parked_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Parked {
    Budget,
    Paused,
    Unavailable,
}

impl Parked {
    pub(super) fn label(self) -> &'static str {
        match self {
            Parked::Budget => "budget",
            Parked::Paused => "paused",
            Parked::Unavailable => "unavailable",
        }
    }
}

/// The buckets a call of `model` through `provider` spends from (none without a budget).
pub(super) fn buckets(cx: &Cx<'_>, provider: &str, model: &str) -> Vec<Bucket> {
    cx.config.common.llm.budget_of(provider).map(|b| b.buckets(model)).unwrap_or_default()
}

/// The reservation's id: one per step and attempt, so a parked step finds its own slot again.
fn reservation_id(step: &ClaimedStep<'_>) -> String {
    let e = step.envelope;
    format!("{}:{}:{}:{}", e.execution_id, e.gen, step.job.round, e.attempt)
}

/// The tenant a step waits as, and its share (`FLEET_TENANT_WEIGHTS`).
fn tenant_of<'a>(cx: &Cx<'_>, state: &'a TurnState) -> (&'a str, u32) {
    let tenant = state.tenant.as_deref().unwrap_or(fair::NO_TENANT);
    (tenant, fair::setting_for(&cx.config.tenant_weights, tenant).map_or(1, |(w, _)| w))
}

/// A provider's answer to a step's ask, made before it was needed (`ask_ahead`).
pub(super) struct Ahead(Result<Spend, StoreError>);

/// Asks a provider without a budget whether it is paused, beside the session's take: with no
/// bucket the ask only reads (nothing is reserved), so it need not wait for the session, and the
/// turn's opening is one round trip shorter. A provider with a budget is asked in turn (`admit`):
/// its reservation is a write, made only once the session is the step's. `None` then, and for a
/// compaction (whose summary asks for itself).
pub(super) async fn ask_ahead(step: &ClaimedStep<'_>, state: &TurnState) -> Option<Ahead> {
    let (provider, model, _) = step.target(state);
    if state.compaction.is_some() || !buckets(&step.cx, &provider, &model).is_empty() {
        return None;
    }
    Some(Ahead(ask(step, state, &provider, &[], 0).await))
}

/// The budget script's answer for the step's call of `tokens` from `buckets`.
async fn ask(
    step: &ClaimedStep<'_>,
    state: &TurnState,
    provider: &str,
    buckets: &[Bucket],
    tokens: u64,
) -> Result<Spend, StoreError> {
    let id = reservation_id(step);
    let (tenant, weight) = tenant_of(&step.cx, state);
    let waiter = Waiter { id: &id, tenant, weight, priority: state.priority };
    step.cx.store.limits().budget_reserve(provider, buckets, waiter, tokens, EARLY_RETURN_TOLERANCE, false).await
}

/// Spends `tokens` of the provider's budget for the step's call now, or parks the step until its
/// place in the provider's fair line may come (`fleet_protocol::fair`); `Err` is how the step
/// ends. Redis unavailable parks it too when the provider has a budget (fail closed, as the claim
/// does); without one, only a pause could have stopped the call, and the call goes on. `ahead` is
/// the pause asked beside the session's take (a provider without a budget).
pub(super) async fn admit(
    step: &ClaimedStep<'_>,
    state: &TurnState,
    provider: &str,
    model: &str,
    tokens: u64,
    ahead: Option<Ahead>,
) -> Result<BudgetReservation, Outcome> {
    let cx = &step.cx;
    let buckets = buckets(cx, provider, model);
    let tenant = tenant_of(cx, state).0;
    let reserved =
        |buckets, tokens| BudgetReservation { provider: provider.to_string(), buckets, tokens, tenant: tenant.into() };
    let asked = match ahead {
        Some(Ahead(asked)) if buckets.is_empty() => asked,
        _ => ask(step, state, provider, &buckets, tokens).await,
    };
    let (reason, wait) = match asked {
        // Without a bucket nothing was taken: the reservation is the estimate.
        Ok(Spend::Now { .. }) if buckets.is_empty() => return Ok(reserved(buckets, tokens)),
        Ok(Spend::Now { reserved: tokens }) => return Ok(reserved(buckets, tokens)),
        Ok(Spend::Wait(wait)) => (Parked::Budget, wait),
        Ok(Spend::Paused(wait)) => (Parked::Paused, wait),
        Err(e) if buckets.is_empty() => {
            tracing::debug!(error = %e, "cannot check the provider's pause; the call goes on");
            return Ok(reserved(buckets, tokens));
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot check the provider's budget (Redis unavailable); parked");
            (Parked::Unavailable, cx.soon())
        }
    };
    cx.metrics.llm_budget_parked.with_label_values(&[provider, reason.label()]).inc();
    cx.metrics.llm_budget_wait.with_label_values(&[provider]).observe(wait.as_secs_f64());
    tracing::debug!(reason = reason.label(), wait_ms = wait.as_millis() as u64, "parked by the provider's budget");
    Err(step.release_and_park_for(wait).await)
}

/// A fallback provider's go-ahead within the same attempt: only if its budget has room now for
/// everyone waiting for it and this call (the attempt does not wait, and takes no place).
pub(super) async fn try_now(
    cx: &Cx<'_>,
    first: &BudgetReservation,
    id: &str,
    provider: &str,
    model: &str,
) -> Option<BudgetReservation> {
    let buckets = buckets(cx, provider, model);
    let tenant = first.tenant.clone();
    let waiter = Waiter { id, tenant: &tenant, weight: 1, priority: Priority::Normal };
    match cx.store.limits().budget_reserve(provider, &buckets, waiter, first.tokens, Duration::ZERO, true).await {
        Ok(Spend::Now { reserved }) => {
            Some(BudgetReservation { provider: provider.to_string(), buckets, tokens: reserved, tenant })
        }
        Ok(_) => None,
        Err(_) => buckets.is_empty().then(|| BudgetReservation {
            provider: provider.to_string(),
            buckets,
            tokens: first.tokens,
            tenant,
        }),
    }
}

/// After a call answered: the tokens it used (the reservation stands when none were reported)
/// and what the provider said of its limits. A failure leaves the reservation as it was.
pub(super) async fn settle(cx: &Cx<'_>, reserved: &BudgetReservation, used: Option<u64>, limits: &ProviderLimits) {
    let provider = reserved.provider.as_str();
    cx.metrics.llm_budget_used.with_label_values(&[provider, Unit::Requests.label()]).inc();
    cx.metrics.llm_budget_used.with_label_values(&[provider, Unit::Tokens.label()]).inc_by(used.unwrap_or(0));
    let told = limits.remaining_requests.is_some() || limits.remaining_tokens.is_some();
    if !reserved.buckets.is_empty() && (used.is_some() || told) {
        let used = used.unwrap_or(reserved.tokens);
        if let Err(e) =
            cx.store.limits().budget_settle(provider, &reserved.buckets, reserved.tokens, used, limits).await
        {
            log_unsettled(&e);
        }
    }
    // A provider with nothing left until its reset is paused like one that answered 429.
    if let Some(pause) = limits.exhausted_for() {
        if let Err(e) = cx.store.limits().budget_pause(provider, &reserved.buckets, pause).await {
            log_unsettled(&e);
        }
    }
}

/// A provider's 429: it is paused for every worker for what it asked (or its reset, or a second).
/// Answers the pause, for the step's retry to wait at least as long.
pub(super) async fn rate_limited(
    cx: &Cx<'_>,
    reserved: &BudgetReservation,
    retry_after: Option<Duration>,
    limits: &ProviderLimits,
) -> Duration {
    let pause = pause_after_429(retry_after, limits);
    tracing::warn!(provider = %reserved.provider, pause_ms = pause.as_millis() as u64, "the provider answered 429; paused fleet-wide");
    let lasts = match cx.store.limits().budget_pause(&reserved.provider, &reserved.buckets, pause).await {
        Ok(lasts) => lasts.max(pause),
        Err(e) => {
            log_unsettled(&e);
            pause
        }
    };
    // Counted once the pause is stored: a 429 counted is a provider every worker now waits for.
    cx.metrics.llm_rate_limited.with_label_values(&[&reserved.provider]).inc();
    lasts
}

/// How soon a turn waiting for one of its tenant's slots asks again when it stands first in line;
/// a turn further back waits this much longer per full round of the tenant's slots ahead of it.
const TURN_SLOT_RECHECK: Duration = Duration::from_millis(250);

/// One of a tenant's running-turn slots (`FLEET_TENANT_MAX_CONCURRENT_TURNS`), held for a step.
pub(super) struct TurnSlot {
    tenant: String,
    holder: String,
}

/// Takes one of the turn's tenant's slots for this step, or parks the step (no worker slot held,
/// no attempt spent) until its place in the tenant's line may come. A tenant without a cap holds
/// none. Redis unavailable parks the step (fail closed).
pub(super) async fn take_turn_slot(step: &ClaimedStep<'_>, state: &TurnState) -> Result<Option<TurnSlot>, Outcome> {
    let cx = &step.cx;
    let tenant = state.tenant.as_deref().unwrap_or(fair::NO_TENANT);
    let Some((limit, named)) = fair::setting_for(&cx.config.tenant_max_turns, tenant) else { return Ok(None) };
    let label = if named { tenant } else { "other" };
    let turn = step.envelope.execution_id.as_str();
    let holder = limits::holder(turn, step.held.token);
    let lease = cx.config.claim_lease;
    match cx.store.limits().acquire_turn_slot(tenant, &holder, turn, limit, lease, TURN_SLOT_RECHECK).await {
        Ok(Pace::Now) => Ok(Some(TurnSlot { tenant: tenant.to_string(), holder })),
        Ok(Pace::Wait(wait)) => {
            cx.metrics.tenant_turns_parked.with_label_values(&[label, "concurrency"]).inc();
            tracing::debug!(tenant, wait_ms = wait.as_millis() as u64, "parked: the tenant's turns are all running");
            Err(step.release_and_park_for(wait).await)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot take the tenant's turn slot (Redis unavailable); parked");
            cx.metrics.tenant_turns_parked.with_label_values(&[label, "unavailable"]).inc();
            Err(step.release_and_park().await)
        }
    }
}

/// Runs the step's `work` while renewing its turn slot, as the claim is renewed around it, and
/// gives the slot back however the work ends (a lost worker's lease runs out by itself).
pub(super) async fn holding_turn_slot<T>(cx: &Cx<'_>, slot: Option<TurnSlot>, work: impl Future<Output = T>) -> T {
    let Some(slot) = slot else { return work.await };
    let semaphore = Semaphore::TenantTurns(&slot.tenant);
    let out = limits::holding_slot(cx, semaphore, &slot.holder, work).await;
    limits::give_back(cx, semaphore, &slot.holder).await;
    out
}

/// A turn whose tenant has a daily cap (`FLEET_TENANT_DAILY_TOKENS`) and has used it up today ends
/// before its model call, dead-lettered with `budget_exceeded` (its `error` event says so). Redis
/// unavailable parks the step (fail closed, as the provider's budget does).
pub(super) async fn within_tenant_cap(step: &ClaimedStep<'_>, tenant: Option<&str>) -> Result<(), Outcome> {
    let cx = &step.cx;
    let Some((tenant, cap)) = tenant.and_then(|t| cx.config.tenant_daily_tokens.get(t).map(|cap| (t, *cap))) else {
        return Ok(());
    };
    let used = match cx.store.limits().usage_today(tenant, fleet_platform::now_ms()).await {
        Ok(used) => used,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the tenant's usage (Redis unavailable); parked");
            return Err(step.release_and_park().await);
        }
    };
    if fleet_protocol::tenant::within_cap(Some(cap), used) {
        return Ok(());
    }
    let error = format!("tenant {tenant} used {used} of its {cap} tokens for today (UTC): no model call is made");
    Err(Outcome::DeadLetter(DeadLetter {
        reason: DeadLetterReason::Permanent,
        error,
        record: None,
        held: Some(step.held),
        code: Some("budget_exceeded"),
    }))
}

/// After a model call answered: its tokens join its tenant's, assistant's and session's hourly
/// usage. A failure to count is logged, never the turn's failure.
pub(super) async fn count_usage(
    cx: &Cx<'_>,
    call: Option<fleet_protocol::tenant::Call<'_>>,
    prompt: u64,
    completion: u64,
) {
    let Some(call) = call else { return };
    if let Err(e) = cx.store.limits().usage_record(call, fleet_platform::now_ms(), prompt, completion).await {
        tracing::warn!(error = %e, "cannot count the model call's usage");
    }
}

fn log_unsettled(e: &StoreError) {
    tracing::debug!(error = %e, "cannot settle the provider's budget; its reservation stands");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn park_reasons_are_the_metrics_labels() {
        let labels: Vec<_> = [Parked::Budget, Parked::Paused, Parked::Unavailable].iter().map(|p| p.label()).collect();
        assert_eq!(labels, ["budget", "paused", "unavailable"]);
    }
}
