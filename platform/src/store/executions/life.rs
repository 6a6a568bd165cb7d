//! An execution's life in Redis: its claim, its record, its attempts and (for a turn) its state
//! share one hash slot, so each moment of its life is one script. `admit` decides what a delivery
//! is (the record's step, a copy, owed work, done, busy, cancelled) and claims it; `transition`
//! writes everything one step's end changes, fenced by the claim's token (or by what the record
//! owes, for a copy that carries owed work out); `settle_owed` retires what a transition owed.
//! Every write is conditional on the state it expects, so a copy of a job has no effect beyond
//! its ack.

use crate::store::script::Lua;
use std::time::Duration;

use serde_json::Value;

use fleet_protocol::execution::{field, AttemptRecord, ExecutionStatus};
use fleet_protocol::life::{Claimed, Owed, Step};
use fleet_protocol::turn::TurnState;
use fleet_protocol::IDEMPOTENCY_TTL_SECS;

use super::Executions;
use crate::store::connection::{eval, eval_pair, evalsha};
use crate::store::StoreError;

static ADMIT: Lua = Lua::new(|| crate::store::script::load(&[CLOCK_LUA, ADMIT_LUA]));
static TRANSITION: Lua = Lua::new(|| crate::store::script::load(&[CLOCK_LUA, TRANSITION_LUA]));
static SETTLE_OWED: Lua = Lua::new(|| crate::store::script::load(&[SETTLE_OWED_LUA]));
static CREATE: Lua = Lua::new(|| crate::store::script::load(&[CREATE_LUA]));
static REPLAY: Lua = Lua::new(|| crate::store::script::load(&[REPLAY_LUA]));
static BEGIN: Lua = Lua::new(|| crate::store::script::load(&[BEGIN_LUA]));
static RENEW: Lua = Lua::new(|| crate::store::script::load(&[RENEW_LUA]));
static MARK_PARKED: Lua = Lua::new(|| crate::store::script::load(&[MARK_PARKED_LUA]));
static ANSWER_STEER: Lua = Lua::new(|| crate::store::script::load(&[ANSWER_STEER_LUA]));

// What the job's two scripts (claim, then result) share. Every `redis.call` costs about as much as
// a command of its own, so the usual path makes as few as it can: a record's TTL is raised with
// one `EXPIRE GT`. Numbers written back are formatted as integers: Lua formats any other number
// as a double (`%.14g`), which showed in Redis's profile.
const CLOCK_LUA: &str = include_str!("lua/clock.lua");

// KEYS: claim, record, and a turn's state when its step is claimed with it. ARGV: owner, lease
// ms, ttl s, the delivery's step (gen, round, attempt, poll), mode (`run` marks the record
// running, `hold` only claims, `take` claims even from a live lease: a job whose end is decided,
// after its worker kept dying), the delivery's park ('' for none), the slack (ms) a park marker
// outlives its due time by.
// An earlier step is a copy, unless the record owes something (then the copy carries it out, under
// a lease of its own so two copies do not). So is the record's own step while it is parked (see
// `MARK_PARKED_LUA`) and the delivery is not the parked one. A step at or past the record's is
// claimed with a token past any the claim or the record has seen, so a lost claim key cannot fence
// the record off; the claim clears the park marker.
const ADMIT_LUA: &str = include_str!("lua/admit.lua");

// KEYS: claim, record, attempts, turn state (only with a state to write). ARGV: token, ttl, claim
// (keep|release|complete|none), lease ms, the owed value this write consumes ('' to be fenced by
// the token instead), attempt entry, turn state, result, the claim's state when released, then
// field/value pairs.
// A claim that is gone was lost, not taken (nothing deletes one; a failover can drop writes): the
// record's fence decides then. A complete already made by this token is this worker's own, retried
// after its reply was lost.
const TRANSITION_LUA: &str = include_str!("lua/transition.lua");

// KEYS: record. ARGV: the owed value done, then field/value pairs. Retires it only if it is
// still what the record owes (a copy may have retired it first).
const SETTLE_OWED_LUA: &str = include_str!("lua/settle_owed.lua");

// KEYS: record, turn state. ARGV: ttl, turn state ('' for none), then field/value pairs. Only
// if there is no record yet: a republish, a fan-out or a notification run twice leaves a live
// record as it is.
const CREATE_LUA: &str = include_str!("lua/create.lua");

// KEYS: record, claim. ARGV: the round the replay runs, ttl. A dead-lettered execution starts its
// next generation: every job from before is a copy from now on. Answers the generation, or -1 when
// the record is not dead-lettered (-2: no record).
const REPLAY_LUA: &str = include_str!("lua/replay.lua");

// KEYS: claim, record. ARGV: token, attempt. The attempt's `running` write after a claim made in
// `hold` mode (a call that had to pass its tool's limits first): refused once the execution was
// cancelled (2) or a newer claim took it (0).
const BEGIN_LUA: &str = include_str!("lua/begin.lua");

// KEYS: claim, record. ARGV: token, the step (gen, round, attempt, poll), due ms. Marks the
// record parked by the claim `token` gave back, once its parked delivery's publish is confirmed:
// only if no claim was made since (the parked delivery, or a copy, may have come back and been
// claimed already) and the record still expects that step. 1 if marked.
const MARK_PARKED_LUA: &str = include_str!("lua/mark_parked.lua");

const RENEW_LUA: &str = include_str!("lua/renew.lua");

// KEYS: claim, record. ARGV: result, ttl. A steering turn whose messages joined the turn it
// steered: it succeeds pointing there, unless it has ended otherwise already.
const ANSWER_STEER_LUA: &str = include_str!("lua/answer_steer.lua");

/// How long past its due time a park marker still makes other deliveries of its step copies
/// (with the claim's lease added): the parked delivery may wait in its work queue a while.
pub const PARK_SLACK: Duration = Duration::from_secs(30);

/// What `admit_delivery` is told of a delivery: its step, the park it carries if any, and whether
/// the claim reads the turn's state with it (a turn's step: one round trip, not two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub step: Step,
    pub park: Option<u64>,
    pub with_turn: bool,
}

/// What `admit_delivery` decided: the delivery's claim, whether a client asked to cancel, and the
/// turn's state read under a claim made with `with_turn` (`None` if it is not beside its claim or
/// does not parse).
#[derive(Debug)]
pub struct DeliveryClaim {
    pub claimed: Claimed,
    pub cancel_requested: bool,
    pub turn: Option<TurnState>,
}

/// How a delivery's step is claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmitMode {
    /// Claims and marks the record running: the step starts at once.
    Run,
    /// Only claims: the step must pass a gate first (a tool's limits, a session).
    Hold,
    /// Claims even from a live lease: a job whose end is decided (its workers kept dying).
    Take,
}

/// What becomes of the claim when a transition is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimAfter<'a> {
    /// Still held (the step goes on).
    Keep,
    /// Given back, its state saying why (`released`, `polling`, `dead_lettered`, `steered`).
    Release(&'a str),
    /// Done, holding the result for 7 days: nothing of the execution runs again.
    Complete(&'a Value),
}

/// Everything one moment of an execution's life writes, in one script: the record's status, the
/// step it expects next and what it still owes, an attempt for the history, a turn's state.
#[derive(Debug, Clone)]
pub struct Transition<'a> {
    pub claim: ClaimAfter<'a>,
    pub status: Option<ExecutionStatus>,
    /// The step the record expects from now on.
    pub step: Option<Step>,
    /// `Some(None)` retires what the record owed; `Some(Some(o))` records `o`.
    pub owed: Option<Option<&'a Owed>>,
    pub attempt: Option<&'a AttemptRecord>,
    pub last_error: Option<&'a str>,
    pub turn: Option<&'a TurnState>,
    /// Further record fields.
    pub fields: Vec<(&'static str, String)>,
}

impl<'a> Transition<'a> {
    pub fn new(claim: ClaimAfter<'a>) -> Self {
        Transition {
            claim,
            status: None,
            step: None,
            owed: None,
            attempt: None,
            last_error: None,
            turn: None,
            fields: vec![],
        }
    }
    pub fn status(mut self, status: ExecutionStatus) -> Self {
        self.status = Some(status);
        self
    }
    pub fn step(mut self, step: Step) -> Self {
        self.step = Some(step);
        self
    }
    pub fn owe(mut self, owed: &'a Owed) -> Self {
        self.owed = Some(Some(owed));
        self
    }
    pub fn owe_nothing(mut self) -> Self {
        self.owed = Some(None);
        self
    }
    pub fn attempt(mut self, attempt: &'a AttemptRecord) -> Self {
        self.attempt = Some(attempt);
        self
    }
    pub fn last_error(mut self, error: &'a str) -> Self {
        self.last_error = Some(error);
        self
    }
    pub fn turn(mut self, state: &'a TurnState) -> Self {
        self.turn = Some(state);
        self
    }
    pub fn field(mut self, name: &'static str, value: impl ToString) -> Self {
        self.fields.push((name, value.to_string()));
        self
    }
}

/// Who may write a transition.
#[derive(Debug, Clone, Copy)]
pub enum Fence<'a> {
    /// The claim's holder, by its token.
    Token(u64),
    /// A copy carrying out what the record owes: only while it still owes exactly this.
    Owed(&'a Owed),
}

/// What an execution expects next, read for a publish that must carry the exact step (a wake).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Expected {
    pub step: Step,
    pub status: ExecutionStatus,
}

/// What `create_execution` wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    New,
    /// A record exists: left as it is.
    Existing,
}

impl Executions {
    /// Decides what a delivery of `step` is and claims it (see `ADMIT_LUA`).
    pub async fn admit(
        &self,
        execution_id: &str,
        owner: &str,
        lease: Duration,
        step: Step,
        mode: AdmitMode,
    ) -> Result<DeliveryClaim, StoreError> {
        self.admit_delivery(execution_id, owner, lease, Delivery { step, park: None, with_turn: false }, mode).await
    }

    /// `admit` for a delivery that may be a parked one: while the record is marked parked by
    /// another park (`mark_parked`), a delivery of that step is a copy, until the mark's due
    /// time and `PARK_SLACK` have passed (a lost parked delivery costs a stall, never the job).
    pub async fn admit_delivery(
        &self,
        execution_id: &str,
        owner: &str,
        lease: Duration,
        delivery: Delivery,
        mode: AdmitMode,
    ) -> Result<DeliveryClaim, StoreError> {
        let step = delivery.step;
        let mut cmd = evalsha(&ADMIT, if delivery.with_turn { 3 } else { 2 });
        cmd.arg(self.redis.keys.idempotency(execution_id)).arg(self.redis.keys.execution(execution_id));
        if delivery.with_turn {
            cmd.arg(self.redis.keys.turn(execution_id));
        }
        cmd.arg(owner)
            .arg(lease.as_millis() as u64)
            .arg(IDEMPOTENCY_TTL_SECS)
            .arg(step.gen)
            .arg(step.round)
            .arg(step.attempt)
            .arg(step.poll)
            .arg(match mode {
                AdmitMode::Run => "run",
                AdmitMode::Hold => "hold",
                AdmitMode::Take => "take",
            })
            .arg(delivery.park.map(|p| p.to_string()).unwrap_or_default())
            .arg((PARK_SLACK + lease).as_millis() as u64);
        let r: Result<Vec<String>, _> = eval(&mut self.redis.conn().await?, &ADMIT, &cmd).await;
        let reply = self.redis.count(r)?;
        let corrupt = |what: &str| StoreError::Corrupt(format!("claim of {execution_id}: {what}"));
        let part = |i: usize| reply.get(i).map(String::as_str).unwrap_or_default();
        let json =
            |text: &str| -> Option<Value> { (!text.is_empty()).then(|| serde_json::from_str(text).ok()).flatten() };
        let only = |claimed| Ok(DeliveryClaim { claimed, cancel_requested: false, turn: None });
        match part(0) {
            "claimed" => {
                let token = part(1).parse().map_err(|_| corrupt("token"))?;
                // A state that does not parse is left to the step's own read, which reports it.
                let turn = serde_json::from_str(part(3)).ok();
                Ok(DeliveryClaim { claimed: Claimed::Held { token }, cancel_requested: part(2) == "1", turn })
            }
            "copy" => only(Claimed::Copy),
            "owed" => match Owed::parse(part(1)) {
                Some(owed) => only(Claimed::Owed { owed, result: json(part(2)) }),
                // A form a newer fleet wrote: it is that fleet's to carry out.
                None => only(Claimed::Copy),
            },
            "done" => {
                let from_claim = json(part(2)).and_then(|c| c.get("result").cloned());
                only(Claimed::Done { result: json(part(1)).or(from_claim).unwrap_or(Value::Null) })
            }
            "busy" => only(Claimed::Busy { remaining_ms: part(1).parse().unwrap_or(1000) }),
            "cancelled" => only(Claimed::Cancelled),
            "missing" => only(Claimed::Missing),
            other => Err(corrupt(&format!("the script answered {other:?}"))),
        }
    }

    /// Marks the record parked by the claim `token` gave back, its parked delivery due at
    /// `until_ms`: call only once that delivery's publish is confirmed (a mark for a delivery
    /// that is not on a queue would make every copy of the step a copy until it expires). `false`:
    /// not marked (a claim was made since, or the step moved on).
    pub async fn mark_parked(
        &self,
        execution_id: &str,
        token: u64,
        step: Step,
        until_ms: i64,
    ) -> Result<bool, StoreError> {
        let r: Result<i64, _> = MARK_PARKED
            .key(self.redis.keys.idempotency(execution_id))
            .key(self.redis.keys.execution(execution_id))
            .arg(token)
            .arg(step.gen)
            .arg(step.round)
            .arg(step.attempt)
            .arg(step.poll)
            .arg(until_ms)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)? == 1)
    }

    /// The `running` write of an attempt whose claim was made in `hold` mode.
    pub async fn begin_attempt(&self, execution_id: &str, token: u64, attempt: u32) -> Result<Begin, StoreError> {
        let r: Result<i64, _> = BEGIN
            .key(self.redis.keys.idempotency(execution_id))
            .key(self.redis.keys.execution(execution_id))
            .arg(token)
            .arg(attempt)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        Ok(match self.redis.count(r)? {
            1 => Begin::Started,
            2 => Begin::Cancelled,
            _ => Begin::Fenced,
        })
    }

    /// Extends the lease if `token` still holds the claim.
    pub async fn renew(&self, execution_id: &str, token: u64, lease: Duration) -> Result<bool, StoreError> {
        let r: Result<i64, _> = RENEW
            .key(self.redis.keys.idempotency(execution_id))
            .arg(token)
            .arg(lease.as_millis() as u64)
            .arg(IDEMPOTENCY_TTL_SECS)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)? == 1)
    }

    /// Writes `t` if `fence` still may; `false`: a newer claim (or another carrier of the owed
    /// work) wrote first, and nothing was written.
    pub async fn transition(
        &self,
        execution_id: &str,
        fence: Fence<'_>,
        lease: Duration,
        t: &Transition<'_>,
    ) -> Result<bool, StoreError> {
        let (token, expect_owed) = match fence {
            Fence::Token(token) => (token, String::new()),
            Fence::Owed(owed) => (0, owed.to_json()),
        };
        let (claim, result, released) = match t.claim {
            ClaimAfter::Keep => ("keep", None, ""),
            ClaimAfter::Release(state) => ("release", None, state),
            ClaimAfter::Complete(result) => ("complete", Some(result.to_string()), ""),
        };
        // The turn's state key only when its state is written (a callback's write has none).
        let mut cmd = evalsha(&TRANSITION, if t.turn.is_some() { 4 } else { 3 });
        cmd.arg(self.redis.keys.idempotency(execution_id))
            .arg(self.redis.keys.execution(execution_id))
            .arg(self.redis.keys.attempts(execution_id));
        if t.turn.is_some() {
            cmd.arg(self.redis.keys.turn(execution_id));
        }
        cmd.arg(token)
            .arg(IDEMPOTENCY_TTL_SECS)
            .arg(claim)
            .arg(lease.as_millis() as u64)
            .arg(expect_owed)
            .arg(t.attempt.map(|a| serde_json::to_string(a).expect("an attempt serialises")).unwrap_or_default())
            .arg(t.turn.map(|s| serde_json::to_string(s).expect("a turn state serialises")).unwrap_or_default())
            .arg(result.unwrap_or_default())
            .arg(released);
        for (name, value) in transition_fields(t) {
            cmd.arg(name).arg(value);
        }
        let r: Result<i64, _> = eval(&mut self.redis.conn().await?, &TRANSITION, &cmd).await;
        Ok(self.redis.count(r)? == 1)
    }

    /// Retires `owed` once it is done (and sets `fields` with it), if the record still owes it.
    pub async fn settle_owed(
        &self,
        execution_id: &str,
        owed: &Owed,
        fields: &[(&str, String)],
    ) -> Result<bool, StoreError> {
        let mut inv = SETTLE_OWED.prepare_invoke();
        inv.key(self.redis.keys.execution(execution_id)).arg(owed.to_json());
        for (name, value) in fields {
            inv.arg(*name).arg(value);
        }
        let r: Result<i64, _> = inv.invoke_async(&mut self.redis.conn().await?).await;
        Ok(self.redis.count(r)? == 1)
    }

    /// Creates an execution's record (and a turn's state) unless one exists: a job published
    /// again (a republish, a fan-out or notification run twice) leaves a live record alone. The
    /// record lives 7 days past when its job is due.
    pub async fn create_execution(
        &self,
        e: &super::NewExecution<'_>,
        turn: Option<&TurnState>,
    ) -> Result<Created, StoreError> {
        let fields = e.fields();
        let mut create = evalsha(&CREATE, 2);
        create
            .arg(self.redis.keys.execution(e.execution_id))
            .arg(self.redis.keys.turn(e.execution_id))
            .arg(record_ttl_secs(e.now_ms, e.run_at_ms))
            .arg(turn.map(|s| serde_json::to_string(s).expect("a turn state serialises")).unwrap_or_default());
        for (name, value) in &fields {
            create.arg(*name).arg(value);
        }
        // The index's entry goes out with the record, in the same round trip: an entry for a
        // record that already existed is a no-op (`ZADD NX`), and a listing skips an entry whose
        // record is not there, so neither order matters.
        let mut conn = self.redis.conn().await?;
        let (r, indexed) = eval_pair::<i64, i64>(&mut conn, (&CREATE, create), self.index.index_call(e)).await;
        // The index is derived: an execution it misses is still read by its id, so a failed
        // write is logged, not the record's failure.
        if let Err(error) = indexed {
            tracing::warn!(execution_id = e.execution_id, %error, "cannot enter the execution in the index");
        }
        if self.redis.count(r)? != 1 {
            return Ok(Created::Existing);
        }
        Ok(Created::New)
    }

    /// Starts a dead-lettered execution's next generation, to run from `round` (an operator's
    /// retry): `Ok(None)` if it is not dead-lettered.
    pub async fn replay_execution(&self, execution_id: &str, round: u32) -> Result<Option<u32>, StoreError> {
        let r: Result<i64, _> = REPLAY
            .key(self.redis.keys.execution(execution_id))
            .key(self.redis.keys.idempotency(execution_id))
            .arg(round)
            .arg(IDEMPOTENCY_TTL_SECS)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        let gen = self.redis.count(r)?;
        Ok(u32::try_from(gen).ok())
    }

    /// The step an execution expects next, and its status.
    pub async fn expected(&self, execution_id: &str) -> Result<Option<Expected>, StoreError> {
        let r: Result<Vec<Option<String>>, _> = redis::cmd("HMGET")
            .arg(self.redis.keys.execution(execution_id))
            .arg(field::STATUS)
            .arg(field::GEN)
            .arg(field::STEP_ROUND)
            .arg(field::STEP_ATTEMPT)
            .arg(field::STEP_POLL)
            .query_async(&mut self.redis.conn().await?)
            .await;
        let v = self.redis.count(r)?;
        let Some(status) = v.first().cloned().flatten().and_then(|s| ExecutionStatus::parse(&s)) else {
            return Ok(None);
        };
        let n = |i: usize, d: u32| v.get(i).cloned().flatten().and_then(|s| s.parse().ok()).unwrap_or(d);
        let step = Step { gen: n(1, 0), round: n(2, 0), attempt: n(3, 1), poll: n(4, 0) };
        Ok(Some(Expected { step, status }))
    }

    /// Whether the record is `status` and owes its work until `owed_until` (the lease a
    /// transition gave what it owes): how a writer whose answer was lost (its timeout passed) learns
    /// that its write landed. A read on the same connection comes after the write it follows.
    pub async fn wrote_owing(
        &self,
        execution_id: &str,
        status: ExecutionStatus,
        owed_until: i64,
    ) -> Result<bool, StoreError> {
        let r: Result<(Option<String>, Option<String>), _> = redis::cmd("HMGET")
            .arg(self.redis.keys.execution(execution_id))
            .arg(field::STATUS)
            .arg(field::OWED_UNTIL)
            .query_async(&mut self.redis.conn().await?)
            .await;
        let (found, until) = self.redis.count(r)?;
        Ok(found.as_deref() == Some(status.as_str()) && until.as_deref() == Some(owed_until.to_string().as_str()))
    }

    /// A steering turn whose messages the running turn took: it succeeds with `result`.
    pub async fn answer_steer(&self, execution_id: &str, result: &Value) -> Result<bool, StoreError> {
        let r: Result<i64, _> = ANSWER_STEER
            .key(self.redis.keys.idempotency(execution_id))
            .key(self.redis.keys.execution(execution_id))
            .arg(result.to_string())
            .arg(IDEMPOTENCY_TTL_SECS)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)? == 1)
    }
}

/// How long a record lives: 7 days, or until its job is due and 7 days more (a call may be
/// scheduled 30 days ahead).
pub fn record_ttl_secs(now_ms: i64, due_ms: Option<i64>) -> u64 {
    let until_due = due_ms.map_or(0, |due| ((due - now_ms).max(0) as u64).div_ceil(1000));
    IDEMPOTENCY_TTL_SECS + until_due
}

/// The record fields a transition sets, as name/value pairs.
fn transition_fields<'a>(t: &'a Transition<'a>) -> Vec<(&'a str, String)> {
    let mut fields: Vec<(&str, String)> = Vec::new();
    if let Some(status) = t.status {
        fields.push((field::STATUS, status.as_str().to_string()));
    }
    if let Some(step) = t.step {
        fields.push((field::GEN, step.gen.to_string()));
        fields.push((field::STEP_ROUND, step.round.to_string()));
        fields.push((field::STEP_ATTEMPT, step.attempt.to_string()));
        fields.push((field::STEP_POLL, step.poll.to_string()));
    }
    match t.owed {
        Some(Some(owed)) => fields.push((field::OWED, owed.to_json())),
        Some(None) => fields.push((field::OWED, String::new())),
        None => {}
    }
    if let Some(attempt) = t.attempt {
        fields.push((field::ATTEMPTS, attempt.attempt.to_string()));
    }
    if let Some(error) = t.last_error.or_else(|| t.attempt.and_then(|a| a.error.as_deref())) {
        fields.push((field::LAST_ERROR, error.to_string()));
    }
    fields.extend(t.fields.iter().map(|(n, v)| (*n, v.clone())));
    fields
}

/// What a `running` write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    Started,
    /// A newer claim took the execution: this worker is fenced off.
    Fenced,
    /// The execution was cancelled: nothing may be sent.
    Cancelled,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_outlives_its_due_time_by_seven_days() {
        assert_eq!(record_ttl_secs(1_000, None), IDEMPOTENCY_TTL_SECS);
        assert_eq!(record_ttl_secs(1_000, Some(500)), IDEMPOTENCY_TTL_SECS, "already due");
        assert_eq!(record_ttl_secs(0, Some(30 * 86_400_000)), IDEMPOTENCY_TTL_SECS + 30 * 86_400);
    }
}
