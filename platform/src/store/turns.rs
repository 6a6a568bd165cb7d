//! Agent turns and sessions in Redis: a turn's state and tool-call outcomes (in its execution's
//! slot, written by `store/life.rs`'s transitions), and a session's line, lock, steer list and
//! history (in the session's slot). The lock names the turn holding it and the fencing token of
//! the step that last held it: a session write from an older step of the turn is refused, so a
//! step that a newer claim replaced neither remembers its answer nor frees the session.

use std::collections::HashMap;

use redis::AsyncCommands;

use fleet_protocol::agent_session::ClientCall;
use fleet_protocol::history::{HistoryEntry, HISTORY_TTL_SECS, SESSION_BINDING_TTL_SECS};
use fleet_protocol::life::Owed;
use fleet_protocol::turn::{CallOutcome, TurnState};
use fleet_protocol::IDEMPOTENCY_TTL_SECS;

use super::records::{execution_view, ExecutionView};
use super::{Store, StoreError};

// Built once: `Script::new` hashes its source.
static SESSION_ENQUEUE_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(SESSION_ENQUEUE_LUA));
static SESSION_ACQUIRE_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(&with_lock_helpers(SESSION_ACQUIRE_LUA)));
static SESSION_STEER_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(&with_lock_helpers(SESSION_STEER_LUA)));
static SESSION_TRIM_STEERS_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(&with_lock_helpers(SESSION_TRIM_STEERS_LUA)));
static SESSION_FINISH_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(&with_lock_helpers(SESSION_FINISH_LUA)));
static SESSION_ABANDON_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(&with_lock_helpers(SESSION_ABANDON_LUA)));
static SESSION_COMPACT_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(&with_lock_helpers(SESSION_COMPACT_LUA)));
static SESSION_CLAIM_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(SESSION_CLAIM_LUA));
static CALL_OUTCOME_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(CALL_OUTCOME_LUA));

/// The lock's holder and the fence of the step that holds it (`turn#fence`; a lock written before
/// fences is a bare turn id, fence 0). Shared by the session scripts.
const LOCK_HELPERS: &str = r#"
local function holder_of(raw)
  if not raw then return nil, 0 end
  local at = string.find(raw, '#', 1, true)
  if not at then return raw, 0 end
  return string.sub(raw, 1, at - 1), tonumber(string.sub(raw, at + 1)) or 0
end
"#;

/// Who holds a session: its tenant and its agent (seed 001), each if bound.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionHolders {
    pub tenant: Option<String>,
    pub agent: Option<String>,
}

// KEYS: the session's tenant, its agent. ARGV: the tenant claiming ('': none), the agent ('':
// none), the bindings' ttl. Writes only if neither is another's; `SET NX EX` so a new binding
// expires, `EXPIRE GT` so a renewal never shortens one (nor gives a room's permanent one a TTL).
const SESSION_CLAIM_LUA: &str = r#"
local held = {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}
for i = 1, 2 do
  if ARGV[i] ~= '' and held[i] and held[i] ~= ARGV[i] then return {held[1] or '', held[2] or ''} end
end
for i = 1, 2 do
  if ARGV[i] ~= '' then
    if not redis.call('SET', KEYS[i], ARGV[i], 'NX', 'EX', ARGV[3]) then
      redis.call('EXPIRE', KEYS[i], ARGV[3], 'GT')
    end
    held[i] = ARGV[i]
  elseif held[i] then
    redis.call('EXPIRE', KEYS[i], ARGV[3], 'GT')
  end
end
return {held[1] or '', held[2] or ''}
"#;

const SESSION_ENQUEUE_LUA: &str = r#"
if not redis.call('LPOS', KEYS[1], ARGV[1]) then redis.call('RPUSH', KEYS[1], ARGV[1]) end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"#;

// KEYS: lock, queue, history, history_seq, steer. ARGV: turn, fence, ttl, the history's ttl ('':
// the history is not read). A step that has the session reads what its model call sees with it:
// the history (refreshing its TTL) and the steers waiting, written by nobody else while it holds it.
// The lock has no lease: the turn holding it gives it back however it ends (finished, dead
// letter, delivery limit, cancelled); the TTL only collects the keys of a deleted fleet.
const SESSION_ACQUIRE_LUA: &str = r#"
local function opened(answer)
  local history = {}
  if ARGV[4] ~= '' then
    history = redis.call('LRANGE', KEYS[3], 0, -1)
    redis.call('EXPIRE', KEYS[3], ARGV[4])
    redis.call('EXPIRE', KEYS[4], ARGV[4])
  end
  return {answer, history, redis.call('LRANGE', KEYS[5], 0, -1)}
end
local turn, fence = holder_of(redis.call('GET', KEYS[1]))
local mine = ARGV[1] .. '#' .. ARGV[2]
if turn == ARGV[1] then
  if fence > tonumber(ARGV[2]) then return {'stale', {}, {}} end
  redis.call('SET', KEYS[1], mine, 'EX', ARGV[3])
  return opened('held')
end
if turn then return {'busy', {}, {}} end
local head = redis.call('LINDEX', KEYS[2], 0)
if head and head ~= ARGV[1] then return {'queued', {}, {}} end
if head == ARGV[1] then redis.call('LPOP', KEYS[2]) end
redis.call('SET', KEYS[1], mine, 'EX', ARGV[3])
return opened('acquired')
"#;

// KEYS: lock, queue, steer, steered. ARGV: the steering turn, ttl, then its steers (JSON).
// Hands the messages to the running turn once: a steer already waiting, or already taken, is not
// added again (a copy of the steering turn's step).
const SESSION_STEER_LUA: &str = r#"
local turn = holder_of(redis.call('GET', KEYS[1]))
if not turn or turn == ARGV[1] then return 0 end
if redis.call('SISMEMBER', KEYS[4], ARGV[1]) == 1 then return 1 end
for _, raw in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local ok, s = pcall(cjson.decode, raw)
  if ok and type(s) == 'table' and s.from == ARGV[1] then return 1 end
end
for i = 3, #ARGV do redis.call('RPUSH', KEYS[3], ARGV[i]) end
redis.call('EXPIRE', KEYS[3], ARGV[2])
redis.call('LREM', KEYS[2], 0, ARGV[1])
return 1
"#;

// KEYS: lock, steer, steered. ARGV: turn, fence, ttl, then the steering turns taken. Removes the
// taken steers from the list (they are in the turn's saved state now) and remembers them as taken.
const SESSION_TRIM_STEERS_LUA: &str = r#"
local turn, fence = holder_of(redis.call('GET', KEYS[1]))
if turn ~= ARGV[1] or fence > tonumber(ARGV[2]) then return 0 end
local taken = {}
for i = 4, #ARGV do
  taken[ARGV[i]] = true
  redis.call('SADD', KEYS[3], ARGV[i])
end
redis.call('EXPIRE', KEYS[3], ARGV[3])
for _, raw in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  local ok, s = pcall(cjson.decode, raw)
  if ok and type(s) == 'table' and taken[s.from] then redis.call('LREM', KEYS[2], 0, raw) end
end
return 1
"#;

// KEYS: lock, queue, steer, history, history seq, history turns, history bytes. ARGV: turn, fence,
// append id, history ttl, then the entries to remember. A finishing turn: if steers wait, it keeps
// the session and goes on; else its exchange joins the history (once per append id), the session
// is freed and the next turn in line named. Only the step holding the current fence may. Answers
// also the history's length and bytes, so a trim reads the history only when it is over budget.
const SESSION_FINISH_LUA: &str = r#"
local turn, fence = holder_of(redis.call('GET', KEYS[1]))
if turn ~= ARGV[1] then
  local free = turn == nil and '1' or ''
  return {'not_holder', redis.call('LINDEX', KEYS[2], 0) or '', free}
end
if fence > tonumber(ARGV[2]) then return {'stale', '', ''} end
if redis.call('LLEN', KEYS[3]) > 0 then return {'steer', '', ''} end
local n = #ARGV - 4
if n > 0 and redis.call('SADD', KEYS[6], ARGV[3]) == 1 then
  local last = redis.call('INCRBY', KEYS[5], n)
  local bytes = 0
  for i = 1, n do
    local seq = last - n + i
    local entry = '{"seq":' .. seq .. ',' .. string.sub(ARGV[i + 4], 2)
    bytes = bytes + string.len(entry)
    redis.call('RPUSH', KEYS[4], entry)
  end
  redis.call('INCRBY', KEYS[7], bytes)
  for i = 4, 7 do redis.call('EXPIRE', KEYS[i], ARGV[4]) end
end
redis.call('DEL', KEYS[1])
local size = redis.call('LLEN', KEYS[4]) .. ' ' .. (redis.call('GET', KEYS[7]) or '0')
return {'released', redis.call('LINDEX', KEYS[2], 0) or '', '1', size}
"#;

// A turn that can no longer run leaves its session: out of the line, and if it held the lock,
// the lock is freed and the turns that steered into it go first in line, to run on their own.
const SESSION_ABANDON_LUA: &str = r#"
local turn = holder_of(redis.call('GET', KEYS[1]))
redis.call('LREM', KEYS[2], 0, ARGV[1])
if turn == ARGV[1] then
  local steers = redis.call('LRANGE', KEYS[3], 0, -1)
  redis.call('DEL', KEYS[3], KEYS[1])
  for i = #steers, 1, -1 do
    local ok, s = pcall(cjson.decode, steers[i])
    if ok and type(s) == 'table' and type(s.from) == 'string' and s.from ~= '' then
      redis.call('LREM', KEYS[2], 0, s.from)
      redis.call('LPUSH', KEYS[2], s.from)
    end
  end
  redis.call('EXPIRE', KEYS[2], ARGV[2])
elseif turn then
  return ''
end
return redis.call('LINDEX', KEYS[2], 0) or ''
"#;

// KEYS: lock, history, history turns, history bytes. ARGV: turn, fence, append id, ttl, the last
// seq replaced, the summary entry (JSON, no seq). A compaction's rewrite of the history, once per
// append id and only by the step holding the session: the entries up to that seq leave the head
// of the list and the summary takes their place, with their last seq (cursors stay ordered).
const SESSION_COMPACT_LUA: &str = r#"
if redis.call('SISMEMBER', KEYS[3], ARGV[3]) == 1 then return 'done' end
local turn, fence = holder_of(redis.call('GET', KEYS[1]))
if turn ~= ARGV[1] then return 'not_holder' end
if fence > tonumber(ARGV[2]) then return 'stale' end
redis.call('SADD', KEYS[3], ARGV[3])
local up_to = tonumber(ARGV[5])
local removed = 0
while true do
  local head = redis.call('LINDEX', KEYS[2], 0)
  if not head then break end
  local ok, e = pcall(cjson.decode, head)
  if ok and type(e) == 'table' and type(e.seq) == 'number' and e.seq > up_to then break end
  redis.call('LPOP', KEYS[2])
  removed = removed + string.len(head)
end
local entry = '{"seq":' .. ARGV[5] .. ',' .. string.sub(ARGV[6], 2)
redis.call('LPUSH', KEYS[2], entry)
local bytes = tonumber(redis.call('GET', KEYS[4]) or '0') - removed + string.len(entry)
if bytes < 0 then bytes = 0 end
redis.call('SET', KEYS[4], bytes)
for i = 2, 4 do redis.call('EXPIRE', KEYS[i], ARGV[4]) end
return 'compacted'
"#;

// KEYS: results, record. ARGV: call key, outcome, the round the turn waits in, ttl, the owed value
// that publishes the turn's next step, the one that publishes its calls.
// Records a call's outcome (the first wins) and says whether it completed the round; the report
// that does records, in the turn's own slot, that the next step is owed, so exactly one report
// publishes it (and a copy of a report after the step went out publishes nothing).
const CALL_OUTCOME_LUA: &str = r#"
local first = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if redis.call('TTL', KEYS[1]) < tonumber(ARGV[4]) then redis.call('EXPIRE', KEYS[1], ARGV[4]) end
local r = redis.call('HMGET', KEYS[2], 'status', 's_round', 'pending', 'owed', 'next_published', 'gen', 'message_id')
local answer = {first, '', r[6] or '0', r[7] or ''}
if r[1] ~= 'running' and r[1] ~= 'queued' and r[1] ~= 'retrying' then answer[2] = 'ended' return answer end
if tonumber(r[2] or '-1') ~= tonumber(ARGV[3]) then answer[2] = 'other_round' return answer end
if tonumber(r[5] or '-1') >= tonumber(ARGV[3]) then answer[2] = 'published' return answer end
for key in string.gmatch(r[3] or '', '[^,]+') do
  if redis.call('HEXISTS', KEYS[1], key) == 0 then answer[2] = 'waiting' return answer end
end
local owed = r[4] or ''
if owed == '' or owed == ARGV[6] then
  redis.call('HSET', KEYS[2], 'owed', ARGV[5])
  owed = ARGV[5]
end
if owed == ARGV[5] then answer[2] = 'publish' else answer[2] = 'waiting' end
return answer
"#;

/// What a step read as it took its session: the history (if asked for) and the waiting steers
/// (JSON `Steer`s; read, not taken).
#[derive(Debug, Clone, PartialEq)]
pub struct Opened {
    pub history: Option<Vec<HistoryEntry>>,
    pub steers: Vec<String>,
}

/// What `session_acquire` found.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionSlot {
    /// This turn runs now (it was first in line, or already held the session): what it read.
    Acquired(Opened),
    /// Another turn runs, or is ahead in line.
    Wait,
    /// A newer step of this turn holds the session: this one is fenced off.
    Stale,
}

/// What `session_finish` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionFinish {
    /// Released; the next turn in line (if any) should be woken. The history now holds this many
    /// entries, of this many bytes in all.
    Released { next: Option<String>, history: (usize, usize) },
    /// Steer messages arrived meanwhile: the turn keeps the session and calls the model again.
    SteerPending,
    /// This turn does not hold the session (a finish already ran); the head of the line, and
    /// whether the session is free to wake it.
    NotHolder { next: Option<String>, free: bool },
    /// A newer step of this turn holds the session.
    Stale,
}

/// What `session_compact` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactHistory {
    /// The history was rewritten now, or by an earlier run of the same finish.
    Done,
    /// The step no longer holds the session: a newer one does, or the lock is gone.
    NotHolder,
}

/// What recording a tool call's outcome did for its turn's round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundReport {
    /// Whether this outcome was the call's first (a copy's is not).
    pub first: bool,
    pub round: RoundState,
    /// The turn's generation (for the next step's job) and the message id its round streams under.
    pub gen: u32,
    pub message_id: String,
}

/// Where the turn's round stands after a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundState {
    /// Other calls of the round have no outcome yet.
    Waiting,
    /// This report completed the round (or finds its next step still owed): publish it.
    Publish,
    /// The round's next step went out already.
    Published,
    /// The turn is in another round, or has ended.
    Elsewhere,
}

/// An execution's record hash, attempt entries and turn state (JSON), as read together.
type RecordAndTurn = (HashMap<String, String>, Vec<String>, Option<String>);

/// A turn's state as stored (JSON); one that does not parse is reported as corrupt.
fn parse_turn(execution_id: &str, raw: &str) -> Result<TurnState, StoreError> {
    serde_json::from_str(raw).map_err(|e| StoreError::Corrupt(format!("turn {execution_id}: {e}")))
}

impl Store {
    /// Writes a turn's state with no fence (a replay reopening it).
    pub async fn save_turn(&self, execution_id: &str, state: &TurnState) -> Result<(), StoreError> {
        let json = serde_json::to_string(state).expect("a turn state serialises");
        let r: Result<(), _> =
            self.conn().await?.set_ex(self.keys.turn(execution_id), json, IDEMPOTENCY_TTL_SECS).await;
        self.count(r)
    }

    /// A turn's state; one saved before states moved beside their claims is read where it was.
    pub async fn load_turn(&self, execution_id: &str) -> Result<Option<TurnState>, StoreError> {
        for key in [self.keys.turn(execution_id), self.keys.legacy_turn(execution_id)] {
            let raw: Result<Option<String>, _> = self.conn().await?.get(&key).await;
            if let Some(raw) = self.count(raw)? {
                return parse_turn(execution_id, &raw).map(Some);
            }
        }
        Ok(None)
    }

    /// An execution's record with a turn's state (`None` for other kinds), in one round trip: a
    /// client polling a turn reads both, and they share the claim's slot. A record or state kept
    /// where it was before they moved there is read from there, as `get_execution` and `load_turn` do.
    pub async fn get_execution_and_turn(
        &self,
        execution_id: &str,
    ) -> Result<Option<(ExecutionView, Option<TurnState>)>, StoreError> {
        let r: Result<RecordAndTurn, _> = redis::pipe()
            .hgetall(self.keys.execution(execution_id))
            .lrange(self.keys.attempts(execution_id), 0, -1)
            .get(self.keys.turn(execution_id))
            .query_async(&mut self.conn().await?)
            .await;
        let (hash, attempts, turn) = self.count(r)?;
        let view = if hash.is_empty() {
            // The new layout was just read: only the old one is left to look in.
            match self.get_legacy_execution(execution_id).await? {
                Some(view) => view,
                None => return Ok(None),
            }
        } else {
            execution_view(execution_id, &hash, &attempts)?
        };
        let turn = match turn {
            Some(raw) => Some(parse_turn(execution_id, &raw)?),
            None if view.kind == "turn" => self.load_turn(execution_id).await?,
            None => None,
        };
        Ok(Some((view, turn)))
    }

    /// Opens a dead-lettered turn again for a replay: no longer marked dead-lettered, and at the end
    /// of its session's line. Returns false if the turn's state is gone.
    pub async fn reopen_turn(&self, execution_id: &str) -> Result<bool, StoreError> {
        let Some(mut state) = self.load_turn(execution_id).await? else { return Ok(false) };
        state.dead_lettered = false;
        self.save_turn(execution_id, &state).await?;
        self.session_enqueue(&state.session_id, execution_id).await?;
        Ok(true)
    }

    /// Records a tool call's outcome under `key` (the first one wins) for a turn waiting in
    /// `round` (see `CALL_OUTCOME_LUA`).
    pub async fn record_call_outcome(
        &self,
        turn_execution_id: &str,
        key: &str,
        outcome: &CallOutcome,
        round: u32,
    ) -> Result<RoundReport, StoreError> {
        let r: Result<(i64, String, String, String), _> = CALL_OUTCOME_SCRIPT
            .key(self.keys.turn_results(turn_execution_id))
            .key(self.keys.execution(turn_execution_id))
            .arg(key)
            .arg(serde_json::to_string(outcome).expect("an outcome serialises"))
            .arg(round)
            .arg(IDEMPOTENCY_TTL_SECS)
            .arg(Owed::TurnNext.to_json())
            .arg(Owed::TurnCalls.to_json())
            .invoke_async(&mut self.conn().await?)
            .await;
        let (first, state, gen, message_id) = self.count(r)?;
        let round = match state.as_str() {
            "publish" => RoundState::Publish,
            "published" => RoundState::Published,
            "waiting" => RoundState::Waiting,
            _ => RoundState::Elsewhere,
        };
        Ok(RoundReport { first: first == 1, round, gen: gen.parse().unwrap_or(0), message_id })
    }

    pub async fn call_outcomes(&self, turn_execution_id: &str) -> Result<HashMap<String, CallOutcome>, StoreError> {
        let r: Result<HashMap<String, String>, _> =
            self.conn().await?.hgetall(self.keys.turn_results(turn_execution_id)).await;
        Ok(self.count(r)?.into_iter().filter_map(|(k, v)| serde_json::from_str(&v).ok().map(|o| (k, o))).collect())
    }

    /// Puts a turn in its session's line (at acceptance, so arrival order is the order they run),
    /// once: a republished turn already in line keeps its place.
    pub async fn session_enqueue(&self, session_id: &str, execution_id: &str) -> Result<(), StoreError> {
        let r: Result<i64, _> = SESSION_ENQUEUE_SCRIPT
            .key(self.keys.session(session_id, "queue"))
            .arg(execution_id)
            .arg(IDEMPOTENCY_TTL_SECS)
            .invoke_async(&mut self.conn().await?)
            .await;
        self.count(r).map(|_| ())
    }

    pub async fn session_dequeue(&self, session_id: &str, execution_id: &str) -> Result<(), StoreError> {
        let r: Result<(), _> = self.conn().await?.lrem(self.keys.session(session_id, "queue"), 0, execution_id).await;
        self.count(r)
    }

    /// Takes (or keeps) the session for the step of `execution_id` holding `fence`, if it is its
    /// turn, reading with it the steers waiting and (`with_history`) the session's history. The
    /// lock is held until the turn gives it back, however long its tools take.
    pub async fn session_acquire(
        &self,
        session_id: &str,
        execution_id: &str,
        fence: u64,
        with_history: bool,
    ) -> Result<SessionSlot, StoreError> {
        let script = &*SESSION_ACQUIRE_SCRIPT;
        let mut inv = script.prepare_invoke();
        for part in ["lock", "queue", "history", "history_seq", "steer"] {
            inv.key(self.keys.session(session_id, part));
        }
        let history_ttl = if with_history { HISTORY_TTL_SECS.to_string() } else { String::new() };
        inv.arg(execution_id).arg(fence).arg(IDEMPOTENCY_TTL_SECS).arg(history_ttl);
        let r: Result<(String, Vec<String>, Vec<String>), _> = inv.invoke_async(&mut self.conn().await?).await;
        let (answer, history, steers) = self.count(r)?;
        Ok(match answer.as_str() {
            "acquired" | "held" => SessionSlot::Acquired(Opened {
                history: with_history.then(|| crate::session_history::parse_entries(&history)),
                steers,
            }),
            "stale" => SessionSlot::Stale,
            _ => SessionSlot::Wait,
        })
    }

    /// If another turn holds the session, hands it `steers` (JSON `Steer`s) for its next model
    /// call, once, and returns true; false means nothing runs, so the steer runs as a turn of its own.
    pub async fn session_steer(
        &self,
        session_id: &str,
        execution_id: &str,
        steers: &[String],
    ) -> Result<bool, StoreError> {
        let script = &*SESSION_STEER_SCRIPT;
        let mut inv = script.prepare_invoke();
        inv.key(self.keys.session(session_id, "lock"))
            .key(self.keys.session(session_id, "queue"))
            .key(self.keys.session(session_id, "steer"))
            .key(self.keys.session(session_id, "steered"))
            .arg(execution_id)
            .arg(IDEMPOTENCY_TTL_SECS);
        for s in steers {
            inv.arg(s);
        }
        let r: Result<i64, _> = inv.invoke_async(&mut self.conn().await?).await;
        Ok(self.count(r)? == 1)
    }

    /// Removes the steers of `taken` (steering turns' ids) from the list, once the turn holding the
    /// session with `fence` saved them; `false` if it no longer holds it.
    pub async fn session_trim_steers(
        &self,
        session_id: &str,
        execution_id: &str,
        fence: u64,
        taken: &[String],
    ) -> Result<bool, StoreError> {
        let script = &*SESSION_TRIM_STEERS_SCRIPT;
        let mut inv = script.prepare_invoke();
        inv.key(self.keys.session(session_id, "lock"))
            .key(self.keys.session(session_id, "steer"))
            .key(self.keys.session(session_id, "steered"))
            .arg(execution_id)
            .arg(fence)
            .arg(IDEMPOTENCY_TTL_SECS);
        for t in taken {
            inv.arg(t);
        }
        let r: Result<i64, _> = inv.invoke_async(&mut self.conn().await?).await;
        Ok(self.count(r)? == 1)
    }

    /// A turn's finish in its session (see `SESSION_FINISH_LUA`): its exchange `entries` join the
    /// history once per `append_id`, and the session goes to the next turn, unless steers wait.
    pub async fn session_finish(
        &self,
        session_id: &str,
        execution_id: &str,
        fence: u64,
        append_id: &str,
        entries: &[HistoryEntry],
    ) -> Result<SessionFinish, StoreError> {
        let script = &*SESSION_FINISH_SCRIPT;
        let mut inv = script.prepare_invoke();
        for part in ["lock", "queue", "steer", "history", "history_seq", "history_turns", "history_bytes"] {
            inv.key(self.keys.session(session_id, part));
        }
        inv.arg(execution_id).arg(fence).arg(append_id).arg(HISTORY_TTL_SECS);
        for e in entries {
            inv.arg(serde_json::to_string(e).expect("an entry serialises"));
        }
        let r: Result<Vec<String>, _> = inv.invoke_async(&mut self.conn().await?).await;
        let reply = self.count(r)?;
        let part = |i: usize| reply.get(i).cloned().unwrap_or_default();
        let next = Some(part(1)).filter(|n| !n.is_empty());
        let free = part(2);
        let size = part(3);
        let mut numbers = size.split(' ').map(|n| n.parse::<usize>().unwrap_or(0));
        let history = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
        Ok(match part(0).as_str() {
            "steer" => SessionFinish::SteerPending,
            "released" => SessionFinish::Released { next, history },
            "stale" => SessionFinish::Stale,
            _ => SessionFinish::NotHolder { next, free: free == "1" },
        })
    }

    /// Whether a turn runs in the session or waits in its line (seed 001's "the session is
    /// already running").
    pub async fn session_busy(&self, session_id: &str) -> Result<bool, StoreError> {
        let r: Result<(bool, i64), _> = redis::pipe()
            .exists(self.keys.session(session_id, "lock"))
            .llen(self.keys.session(session_id, "queue"))
            .query_async(&mut self.conn().await?)
            .await;
        let (locked, waiting) = self.count(r)?;
        Ok(locked || waiting > 0)
    }

    /// Binds the session to `tenant` and to `agent` (each if given), all or nothing: when the
    /// session is already another tenant's or another agent's, nothing is written (a refused
    /// request binds nothing). Renews the bindings it wrote or found for `SESSION_BINDING_TTL_SECS`
    /// (a room's, which never expire, stay so). Answers the holders after the claim.
    pub async fn claim_session(
        &self,
        session_id: &str,
        tenant: Option<&str>,
        agent: Option<&str>,
    ) -> Result<SessionHolders, StoreError> {
        let r: Result<(String, String), _> = SESSION_CLAIM_SCRIPT
            .key(self.keys.session(session_id, "tenant"))
            .key(self.keys.session(session_id, "agent"))
            .arg(tenant.unwrap_or_default())
            .arg(agent.unwrap_or_default())
            .arg(SESSION_BINDING_TTL_SECS)
            .invoke_async(&mut self.conn().await?)
            .await;
        let (tenant, agent) = self.count(r)?;
        let some = |s: String| (!s.is_empty()).then_some(s);
        Ok(SessionHolders { tenant: some(tenant), agent: some(agent) })
    }

    /// Makes the session's tenant binding permanent: a room's session lives as long as the room,
    /// which never expires.
    pub async fn session_binding_persist(&self, session_id: &str) -> Result<(), StoreError> {
        let r: Result<(), _> = redis::pipe()
            .persist(self.keys.session(session_id, "tenant"))
            .ignore()
            .persist(self.keys.session(session_id, "agent"))
            .ignore()
            .query_async(&mut self.conn().await?)
            .await;
        self.count(r)
    }

    /// The tenants of `sessions` (as `session_tenant`), in one pipeline.
    pub async fn session_tenants(&self, sessions: &[&str]) -> Result<Vec<Option<String>>, StoreError> {
        if sessions.is_empty() {
            return Ok(vec![]);
        }
        let mut pipe = redis::pipe();
        for id in sessions {
            pipe.get(self.keys.session(id, "tenant"));
        }
        let r: Result<Vec<Option<String>>, _> = pipe.query_async(&mut self.conn().await?).await;
        self.count(r)
    }

    /// The session's tenant, if a turn bound it to one.
    pub async fn session_tenant(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        let r: Result<Option<String>, _> =
            redis::cmd("GET").arg(self.keys.session(session_id, "tenant")).query_async(&mut self.conn().await?).await;
        self.count(r)
    }

    /// A compaction's rewrite of the session's history (see `SESSION_COMPACT_LUA`).
    pub async fn session_compact(
        &self,
        session_id: &str,
        execution_id: &str,
        fence: u64,
        up_to_seq: u64,
        summary: &HistoryEntry,
    ) -> Result<CompactHistory, StoreError> {
        let script = &*SESSION_COMPACT_SCRIPT;
        let mut inv = script.prepare_invoke();
        for part in ["lock", "history", "history_turns", "history_bytes"] {
            inv.key(self.keys.session(session_id, part));
        }
        inv.arg(execution_id)
            .arg(fence)
            .arg(format!("{execution_id}:compaction"))
            .arg(HISTORY_TTL_SECS)
            .arg(up_to_seq)
            .arg(serde_json::to_string(summary).expect("an entry serialises"));
        let r: Result<String, _> = inv.invoke_async(&mut self.conn().await?).await;
        Ok(match self.count(r)?.as_str() {
            "compacted" | "done" => CompactHistory::Done,
            _ => CompactHistory::NotHolder,
        })
    }

    /// Records which turn's call each client event names (`event id → call`), for the client's
    /// `tool_output` to be checked against.
    pub async fn put_client_calls(&self, session_id: &str, calls: &[(String, ClientCall)]) -> Result<(), StoreError> {
        let key = self.keys.session(session_id, "client_calls");
        let mut pipe = redis::pipe();
        for (event_id, call) in calls {
            pipe.hset(&key, event_id, serde_json::to_string(call).expect("a call serialises")).ignore();
        }
        pipe.expire(&key, IDEMPOTENCY_TTL_SECS as i64).ignore();
        let r: Result<(), _> = pipe.query_async(&mut self.conn().await?).await;
        self.count(r)
    }

    /// The call a client event names, if it named one.
    pub async fn client_call(&self, session_id: &str, event_id: &str) -> Result<Option<ClientCall>, StoreError> {
        let r: Result<Option<String>, _> =
            self.conn().await?.hget(self.keys.session(session_id, "client_calls"), event_id).await;
        Ok(self.count(r)?.and_then(|raw| serde_json::from_str(&raw).ok()))
    }

    /// Takes a turn that can no longer run out of its session (see `SESSION_ABANDON_LUA`); returns
    /// the turn to wake when the session is free.
    pub async fn session_abandon(&self, session_id: &str, execution_id: &str) -> Result<Option<String>, StoreError> {
        let r: Result<String, _> = SESSION_ABANDON_SCRIPT
            .key(self.keys.session(session_id, "lock"))
            .key(self.keys.session(session_id, "queue"))
            .key(self.keys.session(session_id, "steer"))
            .arg(execution_id)
            .arg(IDEMPOTENCY_TTL_SECS)
            .invoke_async(&mut self.conn().await?)
            .await;
        let next = self.count(r)?;
        Ok((!next.is_empty()).then_some(next))
    }
}

/// The session scripts' sources, each with the lock helpers in front.
fn with_lock_helpers(body: &str) -> String {
    format!("{LOCK_HELPERS}{body}")
}
