//! An execution's life in Redis: its claim, its record, its attempts and (for a turn) its state
//! share one hash slot, so each moment of its life is one script. `admit` decides what a delivery
//! is (the record's step, a copy, owed work, done, busy, cancelled) and claims it; `transition`
//! writes everything one step's end changes, fenced by the claim's token (or by what the record
//! owes, for a copy that carries owed work out); `settle_owed` retires what a transition owed.
//! Every write is conditional on the state it expects, so a copy of a job has no effect beyond
//! its ack.

use std::time::Duration;

use serde_json::Value;

use fleet_protocol::execution::{field, AttemptRecord, ExecutionStatus};
use fleet_protocol::life::{Claimed, Owed, Step};
use fleet_protocol::turn::TurnState;
use fleet_protocol::IDEMPOTENCY_TTL_SECS;

use super::connection::{eval, eval_pair, evalsha};
use super::{Store, StoreError};

static ADMIT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(&format!("{CLOCK_LUA}{ADMIT_LUA}")));
static TRANSITION: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(&format!("{CLOCK_LUA}{TRANSITION_LUA}")));
static SETTLE_OWED: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(SETTLE_OWED_LUA));
static CREATE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| redis::Script::new(CREATE_LUA));
static REPLAY: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| redis::Script::new(REPLAY_LUA));
static BEGIN: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| redis::Script::new(BEGIN_LUA));
static RENEW: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| redis::Script::new(RENEW_LUA));
static MARK_PARKED: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(MARK_PARKED_LUA));
static ANSWER_STEER: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(ANSWER_STEER_LUA));

// What the job's two scripts (claim, then result) share. Every `redis.call` costs about as much as
// a command of its own, so the usual path makes as few as it can: a record's TTL is raised with
// one `EXPIRE GT`. Numbers written back are formatted as integers: Lua formats any other number
// as a double (`%.14g`), which showed in Redis's profile.
const CLOCK_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function int(n) return string.format('%d', n) end
-- Keeps `key` alive at least `ttl` seconds; answers how long it lives now. A key without a TTL
-- (GT leaves it alone) gets one, as a TTL check did before.
local function outlive(key, ttl)
  if redis.call('EXPIRE', key, ttl, 'GT') == 1 then return tonumber(ttl) end
  local left = redis.call('TTL', key)
  if left == -1 then redis.call('EXPIRE', key, ttl) return tonumber(ttl) end
  return math.max(left, tonumber(ttl))
end
"#;

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
const ADMIT_LUA: &str = r#"
local r = redis.call('HMGET', KEYS[2], 'status', 'gen', 's_round', 's_attempt', 's_poll', 'fence', 'owed',
  'result', 'cancel_requested', 'owed_until', 'parked_step', 'parked_by', 'parked_until')
local status = r[1]
if not status then return {'missing'} end
local function num(v, d) return tonumber(v or '') or d end
local raw = redis.call('GET', KEYS[1])
local c = nil
if raw then c = cjson.decode(raw) end
local owed = r[7] or ''
if status == 'cancelled' then return {'cancelled'} end
if status == 'dead_lettered' or status == 'failed' then return {'copy', 'ended'} end
local d = {tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])}
local e = {num(r[2], 0), num(r[3], 0), num(r[4], 1), num(r[5], 0)}
local earlier = false
for i = 1, 4 do
  if d[i] ~= e[i] then earlier = d[i] < e[i] break end
end
local done = status == 'succeeded' or (c ~= nil and c.state == 'done')
if done or earlier then
  if owed ~= '' then
    -- The claim's holder, or another copy, may be carrying it out right now.
    if c and c.state == 'claimed' and num(c.lease_until, 0) > now then
      return {'busy', tostring(num(c.lease_until, 0) - now)}
    end
    if num(r[10], 0) > now then return {'busy', tostring(num(r[10], 0) - now)} end
    redis.call('HSET', KEYS[2], 'owed_until', now + tonumber(ARGV[2]))
    return {'owed', owed, r[8] or ''}
  end
  if done then return {'done', r[8] or '', raw or ''} end
  return {'copy', 'earlier'}
end
-- The step is parked, its parked delivery due back: any other delivery of it is a copy.
local parked = r[11] or ''
-- A cancel request lets any delivery in: it ends the step now rather than when it is due.
if ARGV[8] ~= 'take' and not r[9] and parked == table.concat(d, ':') and (r[12] or '') ~= ARGV[9]
  and now < num(r[13], 0) + tonumber(ARGV[10]) then
  return {'copy', 'parked'}
end
if ARGV[8] ~= 'take' and c and c.state == 'claimed' and num(c.lease_until, 0) > now then
  return {'busy', tostring(num(c.lease_until, 0) - now)}
end
local token = int(math.max(num(c and c.token, 0), num(r[6], 0)) + 1)
redis.call('SET', KEYS[1], '{"state":"claimed","token":' .. token .. ',"owner":' .. cjson.encode(ARGV[1])
  .. ',"lease_until":' .. int(now + tonumber(ARGV[2])) .. '}', 'EX', ARGV[3])
local f = {'fence', token}
-- The step's fields only when they move (they read as these defaults while unwritten).
for i = 1, 4 do
  if d[i] ~= e[i] then
    for j, name in ipairs({'gen', 's_round', 's_attempt', 's_poll'}) do f[#f + 1] = name; f[#f + 1] = ARGV[3 + j] end
    break
  end
end
-- This step arrived: whatever the record owed it (its publish) is done.
if owed ~= '' then f[#f + 1] = 'owed'; f[#f + 1] = '' end
if ARGV[8] == 'run' then
  for _, v in ipairs({'status', 'running', 'attempts', ARGV[6], 'updated_at_ms', int(now)}) do f[#f + 1] = v end
end
redis.call('HSET', KEYS[2], unpack(f))
-- Claimed: whatever was parked is running now, or parks again under this claim.
if parked ~= '' then redis.call('HDEL', KEYS[2], 'parked_step', 'parked_by', 'parked_until') end
outlive(KEYS[2], ARGV[3])
-- A turn's step reads its state with its claim (the state a newer claim would have to write after).
local state = KEYS[3] and redis.call('GET', KEYS[3]) or ''
return {'claimed', token, r[9] and '1' or '', state}
"#;

// KEYS: claim, record, attempts, turn state (only with a state to write). ARGV: token, ttl, claim
// (keep|release|complete|none), lease ms, the owed value this write consumes ('' to be fenced by
// the token instead), attempt entry, turn state, result, the claim's state when released, then
// field/value pairs.
// A claim that is gone was lost, not taken (nothing deletes one; a failover can drop writes): the
// record's fence decides then. A complete already made by this token is this worker's own, retried
// after its reply was lost.
const TRANSITION_LUA: &str = r#"
local token = tonumber(ARGV[1])
local raw = redis.call('GET', KEYS[1])
local c = nil
if raw then c = cjson.decode(raw) end
if ARGV[5] ~= '' then
  if (redis.call('HGET', KEYS[2], 'owed') or '') ~= ARGV[5] then return 0 end
elseif c then
  local mine = tonumber(c.token) == token
  if c.state == 'done' then
    if mine and ARGV[3] == 'complete' then return 1 end
    return 0
  end
  if c.state ~= 'claimed' or not mine then return 0 end
elseif tonumber(redis.call('HGET', KEYS[2], 'fence') or '0') > token then
  return 0
end
local ttl = tonumber(ARGV[2])
if ARGV[3] == 'complete' then
  redis.call('SET', KEYS[1], '{"state":"done","token":' .. ARGV[1] .. ',"result":' .. ARGV[8] .. '}', 'EX', ARGV[2])
elseif ARGV[3] == 'release' then
  redis.call('SET', KEYS[1], cjson.encode({state = ARGV[9], token = token}), 'EX', ttl)
elseif ARGV[3] == 'keep' and not c then
  redis.call('SET', KEYS[1], cjson.encode({state = 'claimed', token = token, owner = 'restored',
    lease_until = now + tonumber(ARGV[4])}), 'EX', ttl)
end
local f = {'updated_at_ms', int(now)}
if ARGV[5] == '' then f[#f + 1] = 'fence'; f[#f + 1] = ARGV[1] end
if ARGV[8] ~= '' then f[#f + 1] = 'result'; f[#f + 1] = ARGV[8] end
for i = 10, #ARGV do f[#f + 1] = ARGV[i] end
redis.call('HSET', KEYS[2], unpack(f))
local keep = outlive(KEYS[2], ARGV[2])
if ARGV[6] ~= '' then
  redis.call('RPUSH', KEYS[3], ARGV[6])
  redis.call('EXPIRE', KEYS[3], int(keep))
end
if ARGV[7] ~= '' then redis.call('SET', KEYS[4], ARGV[7], 'EX', int(keep)) end
return 1
"#;

// KEYS: record. ARGV: the owed value done, then field/value pairs. Retires it only if it is
// still what the record owes (a copy may have retired it first).
const SETTLE_OWED_LUA: &str = r#"
if (redis.call('HGET', KEYS[1], 'owed') or '') ~= ARGV[1] then return 0 end
local f = {'owed', ''}
for i = 2, #ARGV do f[#f + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(f))
redis.call('HDEL', KEYS[1], 'owed_until')
return 1
"#;

// KEYS: record, turn state. ARGV: ttl, turn state ('' for none), then field/value pairs. Only
// if there is no record yet: a republish, a fan-out or a notification run twice leaves a live
// record as it is.
const CREATE_LUA: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local f = {}
for i = 3, #ARGV do f[#f + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(f))
redis.call('EXPIRE', KEYS[1], ARGV[1])
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[1]) end
return 1
"#;

// KEYS: record, claim. ARGV: the round the replay runs, ttl. A dead-lettered execution starts its
// next generation: every job from before is a copy from now on. Answers the generation, or -1 when
// the record is not dead-lettered (-2: no record).
const REPLAY_LUA: &str = r#"
local r = redis.call('HMGET', KEYS[1], 'status', 'gen')
if not r[1] then return -2 end
if r[1] ~= 'dead_lettered' then return -1 end
local gen = (tonumber(r[2] or '0') or 0) + 1
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'gen', gen, 's_round', ARGV[1], 's_attempt', 1, 's_poll', 0, 'owed', '',
  'status', 'queued', 'updated_at_ms', now)
redis.call('HDEL', KEYS[1], 'owed_until')
local raw = redis.call('GET', KEYS[2])
if raw then
  local c = cjson.decode(raw)
  redis.call('SET', KEYS[2], cjson.encode({state = 'released', token = c.token}), 'EX', ARGV[2])
end
if redis.call('TTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return gen
"#;

// KEYS: claim, record. ARGV: token, attempt. The attempt's `running` write after a claim made in
// `hold` mode (a call that had to pass its tool's limits first): refused once the execution was
// cancelled (2) or a newer claim took it (0).
const BEGIN_LUA: &str = r#"
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local c = cjson.decode(raw)
if c.state ~= 'claimed' or tonumber(c.token) ~= tonumber(ARGV[1]) then return 0 end
if redis.call('HGET', KEYS[2], 'status') == 'cancelled' then return 2 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[2], 'status', 'running', 'attempts', ARGV[2], 'updated_at_ms', now)
return 1
"#;

// KEYS: claim, record. ARGV: token, the step (gen, round, attempt, poll), due ms. Marks the
// record parked by the claim `token` gave back, once its parked delivery's publish is confirmed:
// only if no claim was made since (the parked delivery, or a copy, may have come back and been
// claimed already) and the record still expects that step. 1 if marked.
const MARK_PARKED_LUA: &str = r#"
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local c = cjson.decode(raw)
if c.state == 'claimed' or tonumber(c.token) ~= tonumber(ARGV[1]) then return 0 end
local r = redis.call('HMGET', KEYS[2], 'status', 'gen', 's_round', 's_attempt', 's_poll')
local status = r[1]
if not status or status == 'succeeded' or status == 'failed' or status == 'dead_lettered'
  or status == 'cancelled' then return 0 end
local function num(v, d) return tonumber(v or '') or d end
local e = {num(r[2], 0), num(r[3], 0), num(r[4], 1), num(r[5], 0)}
for i = 1, 4 do
  if e[i] ~= tonumber(ARGV[i + 1]) then return 0 end
end
redis.call('HSET', KEYS[2], 'parked_step', table.concat(e, ':'), 'parked_by', ARGV[1], 'parked_until', ARGV[6])
return 1
"#;

const RENEW_LUA: &str = r#"
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local v = cjson.decode(raw)
if v.state ~= 'claimed' or tonumber(v.token) ~= tonumber(ARGV[1]) then return 0 end
local t = redis.call('TIME')
v.lease_until = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
redis.call('SET', KEYS[1], cjson.encode(v), 'EX', ARGV[3])
return 1
"#;

// KEYS: claim, record. ARGV: result, ttl. A steering turn whose messages joined the turn it
// steered: it succeeds pointing there, unless it has ended otherwise already.
const ANSWER_STEER_LUA: &str = r#"
local status = redis.call('HGET', KEYS[2], 'status')
if status ~= 'queued' and status ~= 'running' and status ~= 'retrying' then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local raw = redis.call('GET', KEYS[1])
local token = 0
if raw then token = tonumber(cjson.decode(raw).token) or 0 end
redis.call('SET', KEYS[1], '{"state":"done","token":' .. token .. ',"result":' .. ARGV[1] .. '}', 'EX', ARGV[2])
redis.call('HSET', KEYS[2], 'status', 'succeeded', 'result', ARGV[1], 'updated_at_ms', now, 'owed', '')
return 1
"#;

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

impl Store {
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
        cmd.arg(self.keys.idempotency(execution_id)).arg(self.keys.execution(execution_id));
        if delivery.with_turn {
            cmd.arg(self.keys.turn(execution_id));
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
        let r: Result<Vec<String>, _> = eval(&mut self.conn().await?, &ADMIT, &cmd).await;
        let reply = self.count(r)?;
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
            .key(self.keys.idempotency(execution_id))
            .key(self.keys.execution(execution_id))
            .arg(token)
            .arg(step.gen)
            .arg(step.round)
            .arg(step.attempt)
            .arg(step.poll)
            .arg(until_ms)
            .invoke_async(&mut self.conn().await?)
            .await;
        Ok(self.count(r)? == 1)
    }

    /// The `running` write of an attempt whose claim was made in `hold` mode.
    pub async fn begin_attempt(&self, execution_id: &str, token: u64, attempt: u32) -> Result<Begin, StoreError> {
        let r: Result<i64, _> = BEGIN
            .key(self.keys.idempotency(execution_id))
            .key(self.keys.execution(execution_id))
            .arg(token)
            .arg(attempt)
            .invoke_async(&mut self.conn().await?)
            .await;
        Ok(match self.count(r)? {
            1 => Begin::Started,
            2 => Begin::Cancelled,
            _ => Begin::Fenced,
        })
    }

    /// Extends the lease if `token` still holds the claim.
    pub async fn renew(&self, execution_id: &str, token: u64, lease: Duration) -> Result<bool, StoreError> {
        let r: Result<i64, _> = RENEW
            .key(self.keys.idempotency(execution_id))
            .arg(token)
            .arg(lease.as_millis() as u64)
            .arg(IDEMPOTENCY_TTL_SECS)
            .invoke_async(&mut self.conn().await?)
            .await;
        Ok(self.count(r)? == 1)
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
        cmd.arg(self.keys.idempotency(execution_id))
            .arg(self.keys.execution(execution_id))
            .arg(self.keys.attempts(execution_id));
        if t.turn.is_some() {
            cmd.arg(self.keys.turn(execution_id));
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
        let r: Result<i64, _> = eval(&mut self.conn().await?, &TRANSITION, &cmd).await;
        Ok(self.count(r)? == 1)
    }

    /// Retires `owed` once it is done (and sets `fields` with it), if the record still owes it.
    pub async fn settle_owed(
        &self,
        execution_id: &str,
        owed: &Owed,
        fields: &[(&str, String)],
    ) -> Result<bool, StoreError> {
        let mut inv = SETTLE_OWED.prepare_invoke();
        inv.key(self.keys.execution(execution_id)).arg(owed.to_json());
        for (name, value) in fields {
            inv.arg(*name).arg(value);
        }
        let r: Result<i64, _> = inv.invoke_async(&mut self.conn().await?).await;
        Ok(self.count(r)? == 1)
    }

    /// Creates an execution's record (and a turn's state) unless one exists: a job published
    /// again (a republish, a fan-out or notification run twice) leaves a live record alone. The
    /// record lives 7 days past when its job is due.
    pub async fn create_execution(
        &self,
        e: &super::NewExecution<'_>,
        turn: Option<&TurnState>,
    ) -> Result<Created, StoreError> {
        let mut fields = vec![
            (field::KIND, e.kind.to_string()),
            (field::STATUS, ExecutionStatus::Queued.as_str().to_string()),
            (field::CREATED_AT_MS, e.now_ms.to_string()),
            (field::UPDATED_AT_MS, e.now_ms.to_string()),
            (field::ATTEMPTS, "0".to_string()),
        ];
        for (name, value) in [
            (field::TOOL_NAME, e.tool_name),
            (field::ROOM_ID, e.room_id),
            (field::ASSISTANT_ID, e.assistant_id),
            (field::TENANT, e.tenant),
        ] {
            if let Some(v) = value {
                fields.push((name, v.to_string()));
            }
        }
        if let Some(due) = e.run_at_ms {
            fields.push((field::RUN_AT_MS, due.to_string()));
        }
        let mut create = evalsha(&CREATE, 2);
        create
            .arg(self.keys.execution(e.execution_id))
            .arg(self.keys.turn(e.execution_id))
            .arg(record_ttl_secs(e.now_ms, e.run_at_ms))
            .arg(turn.map(|s| serde_json::to_string(s).expect("a turn state serialises")).unwrap_or_default());
        for (name, value) in &fields {
            create.arg(*name).arg(value);
        }
        // The index's entry goes out with the record, in the same round trip: an entry for a
        // record that already existed is a no-op (`ZADD NX`), and a listing skips an entry whose
        // record is not there, so neither order matters.
        let mut conn = self.conn().await?;
        let (r, indexed) = eval_pair::<i64, i64>(&mut conn, (&CREATE, create), self.index_call(e)).await;
        // The index is derived: an execution it misses is still read by its id, so a failed
        // write is logged, not the record's failure.
        if let Err(error) = indexed {
            tracing::warn!(execution_id = e.execution_id, %error, "cannot enter the execution in the index");
        }
        if self.count(r)? != 1 {
            return Ok(Created::Existing);
        }
        Ok(Created::New)
    }

    /// Starts a dead-lettered execution's next generation, to run from `round` (an operator's
    /// retry): `Ok(None)` if it is not dead-lettered.
    pub async fn replay_execution(&self, execution_id: &str, round: u32) -> Result<Option<u32>, StoreError> {
        let r: Result<i64, _> = REPLAY
            .key(self.keys.execution(execution_id))
            .key(self.keys.idempotency(execution_id))
            .arg(round)
            .arg(IDEMPOTENCY_TTL_SECS)
            .invoke_async(&mut self.conn().await?)
            .await;
        let gen = self.count(r)?;
        Ok(u32::try_from(gen).ok())
    }

    /// The step an execution expects next, and its status.
    pub async fn expected(&self, execution_id: &str) -> Result<Option<Expected>, StoreError> {
        let r: Result<Vec<Option<String>>, _> = redis::cmd("HMGET")
            .arg(self.keys.execution(execution_id))
            .arg(field::STATUS)
            .arg(field::GEN)
            .arg(field::STEP_ROUND)
            .arg(field::STEP_ATTEMPT)
            .arg(field::STEP_POLL)
            .query_async(&mut self.conn().await?)
            .await;
        let v = self.count(r)?;
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
            .arg(self.keys.execution(execution_id))
            .arg(field::STATUS)
            .arg("owed_until")
            .query_async(&mut self.conn().await?)
            .await;
        let (found, until) = self.count(r)?;
        Ok(found.as_deref() == Some(status.as_str()) && until.as_deref() == Some(owed_until.to_string().as_str()))
    }

    /// A steering turn whose messages the running turn took: it succeeds with `result`.
    pub async fn answer_steer(&self, execution_id: &str, result: &Value) -> Result<bool, StoreError> {
        let r: Result<i64, _> = ANSWER_STEER
            .key(self.keys.idempotency(execution_id))
            .key(self.keys.execution(execution_id))
            .arg(result.to_string())
            .arg(IDEMPOTENCY_TTL_SECS)
            .invoke_async(&mut self.conn().await?)
            .await;
        Ok(self.count(r)? == 1)
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
