//! Agent turns and sessions in Redis: a turn's state and tool-call outcomes (in its execution's
//! slot, written by `store/life.rs`'s transitions), and a session's line, lock, steer list and
//! history (in the session's slot). The lock names the turn holding it and the fencing token of
//! the step that last held it: a session write from an older step of the turn is refused, so a
//! step that a newer claim replaced neither remembers its answer nor frees the session.

use crate::store::script::Lua;
use std::collections::HashMap;

use redis::AsyncCommands;

use fleet_protocol::agent_session::ClientCall;
use fleet_protocol::history::{HistoryEntry, HISTORY_TTL_SECS, SESSION_BINDING_TTL_SECS};
use fleet_protocol::life::Owed;
use fleet_protocol::turn::{CallOutcome, TurnState};
use fleet_protocol::IDEMPOTENCY_TTL_SECS;

use super::Sessions;
use crate::store::executions::{execution_view, ExecutionView};
use crate::store::StoreError;

static SESSION_ENQUEUE_SCRIPT: Lua = Lua::new(|| crate::store::script::load(&[SESSION_ENQUEUE_LUA]));
static SESSION_ACQUIRE_SCRIPT: Lua = Lua::new(|| crate::store::script::load(&[LOCK_HELPERS, SESSION_ACQUIRE_LUA]));
static SESSION_STEER_SCRIPT: Lua = Lua::new(|| crate::store::script::load(&[LOCK_HELPERS, SESSION_STEER_LUA]));
static SESSION_TRIM_STEERS_SCRIPT: Lua =
    Lua::new(|| crate::store::script::load(&[LOCK_HELPERS, SESSION_TRIM_STEERS_LUA]));
static SESSION_FINISH_SCRIPT: Lua = Lua::new(|| crate::store::script::load(&[LOCK_HELPERS, SESSION_FINISH_LUA]));
static SESSION_ABANDON_SCRIPT: Lua = Lua::new(|| crate::store::script::load(&[LOCK_HELPERS, SESSION_ABANDON_LUA]));
static SESSION_COMPACT_SCRIPT: Lua = Lua::new(|| crate::store::script::load(&[LOCK_HELPERS, SESSION_COMPACT_LUA]));
static SESSION_CLAIM_SCRIPT: Lua = Lua::new(|| crate::store::script::load(&[SESSION_CLAIM_LUA]));
static CALL_OUTCOME_SCRIPT: Lua = Lua::new(|| crate::store::script::load(&[CALL_OUTCOME_LUA]));

/// The lock's holder and the fence of the step that holds it (`turn#fence`; a lock written before
/// fences is a bare turn id, fence 0). Shared by the session scripts.
const LOCK_HELPERS: &str = include_str!("lua/lock_helpers.lua");

/// Who holds a session: its tenant and its agent (seed 001), each if bound.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionHolders {
    pub tenant: Option<String>,
    pub agent: Option<String>,
}

// KEYS: the session's tenant, its agent. ARGV: the tenant claiming ('': none), the agent ('':
// none), the bindings' ttl. Writes only if neither is another's; `SET NX EX` so a new binding
// expires, `EXPIRE GT` so a renewal never shortens one (nor gives a room's permanent one a TTL).
const SESSION_CLAIM_LUA: &str = include_str!("lua/session_claim.lua");

const SESSION_ENQUEUE_LUA: &str = include_str!("lua/session_enqueue.lua");

// KEYS: lock, queue, history, history_seq, steer. ARGV: turn, fence, ttl, the history's ttl ('':
// the history is not read). A step that has the session reads what its model call sees with it:
// the history (refreshing its TTL) and the steers waiting, written by nobody else while it holds it.
// The lock has no lease: the turn holding it gives it back however it ends (finished, dead
// letter, delivery limit, cancelled); the TTL only collects the keys of a deleted fleet.
const SESSION_ACQUIRE_LUA: &str = include_str!("lua/session_acquire.lua");

// KEYS: lock, queue, steer, steered. ARGV: the steering turn, ttl, then its steers (JSON).
// Hands the messages to the running turn once: a steer already waiting, or already taken, is not
// added again (a copy of the steering turn's step).
const SESSION_STEER_LUA: &str = include_str!("lua/session_steer.lua");

// KEYS: lock, steer, steered. ARGV: turn, fence, ttl, then the steering turns taken. Removes the
// taken steers from the list (they are in the turn's saved state now) and remembers them as taken.
const SESSION_TRIM_STEERS_LUA: &str = include_str!("lua/session_trim_steers.lua");

// KEYS: lock, queue, steer, history, history seq, history turns, history bytes. ARGV: turn, fence,
// append id, history ttl, then the entries to remember. A finishing turn: if steers wait, it keeps
// the session and goes on; else its exchange joins the history (once per append id), the session
// is freed and the next turn in line named. Only the step holding the current fence may. Answers
// also the history's length and bytes, so a trim reads the history only when it is over budget.
const SESSION_FINISH_LUA: &str = include_str!("lua/session_finish.lua");

// A turn that can no longer run leaves its session: out of the line, and if it held the lock,
// the lock is freed and the turns that steered into it go first in line, to run on their own.
const SESSION_ABANDON_LUA: &str = include_str!("lua/session_abandon.lua");

// KEYS: lock, history, history turns, history bytes. ARGV: turn, fence, append id, ttl, the last
// seq replaced, the summary entry (JSON, no seq). A compaction's rewrite of the history, once per
// append id and only by the step holding the session: the entries up to that seq leave the head
// of the list and the summary takes their place, with their last seq (cursors stay ordered).
const SESSION_COMPACT_LUA: &str = include_str!("lua/session_compact.lua");

// KEYS: results, record. ARGV: call key, outcome, the round the turn waits in, ttl, the owed value
// that publishes the turn's next step, the one that publishes its calls.
// Records a call's outcome (the first wins) and says whether it completed the round; the report
// that does records, in the turn's own slot, that the next step is owed, so exactly one report
// publishes it (and a copy of a report after the step went out publishes nothing).
const CALL_OUTCOME_LUA: &str = include_str!("lua/call_outcome.lua");

/// What a step read as it took its session: the history (if asked for) and the waiting steers
/// (JSON `Steer`s; read, not taken).
#[derive(Debug, Clone, PartialEq)]
pub struct Opened {
    pub history: Option<Vec<HistoryEntry>>,
    pub steers: Vec<String>,
    /// The session's current step (seed 001), read with its history.
    pub step: Option<String>,
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

impl Sessions {
    /// Writes a turn's state with no fence (a replay reopening it).
    pub async fn save_turn(&self, execution_id: &str, state: &TurnState) -> Result<(), StoreError> {
        let json = serde_json::to_string(state).expect("a turn state serialises");
        let r: Result<(), _> =
            self.redis.conn().await?.set_ex(self.redis.keys.turn(execution_id), json, IDEMPOTENCY_TTL_SECS).await;
        self.redis.count(r)
    }

    /// A turn's state; one saved before states moved beside their claims is read where it was.
    pub async fn load_turn(&self, execution_id: &str) -> Result<Option<TurnState>, StoreError> {
        for key in [self.redis.keys.turn(execution_id), self.redis.keys.legacy_turn(execution_id)] {
            let raw: Result<Option<String>, _> = self.redis.conn().await?.get(&key).await;
            if let Some(raw) = self.redis.count(raw)? {
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
            .hgetall(self.redis.keys.execution(execution_id))
            .lrange(self.redis.keys.attempts(execution_id), 0, -1)
            .get(self.redis.keys.turn(execution_id))
            .query_async(&mut self.redis.conn().await?)
            .await;
        let (hash, attempts, turn) = self.redis.count(r)?;
        let view = if hash.is_empty() {
            // The new layout was just read: only the old one is left to look in.
            match self.executions.get_legacy_execution(execution_id).await? {
                Some(view) => view,
                None => return Ok(None),
            }
        } else {
            execution_view(execution_id, &hash, &attempts)?
        };
        let turn = match turn {
            Some(raw) => Some(parse_turn(execution_id, &raw)?),
            None if view.record.kind == fleet_protocol::envelope::JobKind::Turn => self.load_turn(execution_id).await?,
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
            .key(self.redis.keys.turn_results(turn_execution_id))
            .key(self.redis.keys.execution(turn_execution_id))
            .arg(key)
            .arg(serde_json::to_string(outcome).expect("an outcome serialises"))
            .arg(round)
            .arg(IDEMPOTENCY_TTL_SECS)
            .arg(Owed::TurnNext.to_json())
            .arg(Owed::TurnCalls.to_json())
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        let (first, state, gen, message_id) = self.redis.count(r)?;
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
            self.redis.conn().await?.hgetall(self.redis.keys.turn_results(turn_execution_id)).await;
        Ok(self
            .redis
            .count(r)?
            .into_iter()
            .filter_map(|(k, v)| serde_json::from_str(&v).ok().map(|o| (k, o)))
            .collect())
    }

    /// Puts a turn in its session's line (at acceptance, so arrival order is the order they run),
    /// once: a republished turn already in line keeps its place.
    pub async fn session_enqueue(&self, session_id: &str, execution_id: &str) -> Result<(), StoreError> {
        let r: Result<i64, _> = SESSION_ENQUEUE_SCRIPT
            .key(self.redis.keys.session(session_id, "queue"))
            .arg(execution_id)
            .arg(IDEMPOTENCY_TTL_SECS)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r).map(|_| ())
    }

    pub async fn session_dequeue(&self, session_id: &str, execution_id: &str) -> Result<(), StoreError> {
        let r: Result<(), _> =
            self.redis.conn().await?.lrem(self.redis.keys.session(session_id, "queue"), 0, execution_id).await;
        self.redis.count(r)
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
        for part in ["lock", "queue", "history", "history_seq", "steer", "step"] {
            inv.key(self.redis.keys.session(session_id, part));
        }
        let history_ttl = if with_history { HISTORY_TTL_SECS.to_string() } else { String::new() };
        inv.arg(execution_id).arg(fence).arg(IDEMPOTENCY_TTL_SECS).arg(history_ttl);
        let r: Result<(String, Vec<String>, Vec<String>, String), _> =
            inv.invoke_async(&mut self.redis.conn().await?).await;
        let (answer, history, steers, step) = self.redis.count(r)?;
        Ok(match answer.as_str() {
            "acquired" | "held" => SessionSlot::Acquired(Opened {
                history: with_history.then(|| super::history::parse_entries(&history)),
                steers,
                step: Some(step).filter(|s| !s.is_empty()),
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
        inv.key(self.redis.keys.session(session_id, "lock"))
            .key(self.redis.keys.session(session_id, "queue"))
            .key(self.redis.keys.session(session_id, "steer"))
            .key(self.redis.keys.session(session_id, "steered"))
            .arg(execution_id)
            .arg(IDEMPOTENCY_TTL_SECS);
        for s in steers {
            inv.arg(s);
        }
        let r: Result<i64, _> = inv.invoke_async(&mut self.redis.conn().await?).await;
        Ok(self.redis.count(r)? == 1)
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
        inv.key(self.redis.keys.session(session_id, "lock"))
            .key(self.redis.keys.session(session_id, "steer"))
            .key(self.redis.keys.session(session_id, "steered"))
            .arg(execution_id)
            .arg(fence)
            .arg(IDEMPOTENCY_TTL_SECS);
        for t in taken {
            inv.arg(t);
        }
        let r: Result<i64, _> = inv.invoke_async(&mut self.redis.conn().await?).await;
        Ok(self.redis.count(r)? == 1)
    }

    /// A turn's finish in its session (see `SESSION_FINISH_LUA`): its exchange `entries` join the
    /// history once per `append_id`, the session stays in `step` (seed 001; `None`: unchanged),
    /// and the session goes to the next turn, unless steers wait.
    pub async fn session_finish(
        &self,
        session_id: &str,
        execution_id: &str,
        fence: u64,
        (append_id, step): (&str, Option<&str>),
        entries: &[HistoryEntry],
    ) -> Result<SessionFinish, StoreError> {
        let script = &*SESSION_FINISH_SCRIPT;
        let mut inv = script.prepare_invoke();
        for part in ["lock", "queue", "steer", "history", "history_seq", "history_turns", "history_bytes", "step"] {
            inv.key(self.redis.keys.session(session_id, part));
        }
        inv.arg(execution_id).arg(fence).arg(append_id).arg(HISTORY_TTL_SECS).arg(step.unwrap_or_default());
        for e in entries {
            inv.arg(serde_json::to_string(e).expect("an entry serialises"));
        }
        let r: Result<Vec<String>, _> = inv.invoke_async(&mut self.redis.conn().await?).await;
        let reply = self.redis.count(r)?;
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

    /// The step the session is in (seed 001), as its last turn left it.
    pub async fn session_step(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        let r: Result<Option<String>, _> =
            self.redis.conn().await?.get(self.redis.keys.session(session_id, "step")).await;
        self.redis.count(r)
    }

    /// Whether a turn runs in the session or waits in its line (seed 001's "the session is
    /// already running").
    pub async fn session_busy(&self, session_id: &str) -> Result<bool, StoreError> {
        let r: Result<(bool, i64), _> = redis::pipe()
            .exists(self.redis.keys.session(session_id, "lock"))
            .llen(self.redis.keys.session(session_id, "queue"))
            .query_async(&mut self.redis.conn().await?)
            .await;
        let (locked, waiting) = self.redis.count(r)?;
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
            .key(self.redis.keys.session(session_id, "tenant"))
            .key(self.redis.keys.session(session_id, "agent"))
            .arg(tenant.unwrap_or_default())
            .arg(agent.unwrap_or_default())
            .arg(SESSION_BINDING_TTL_SECS)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        let (tenant, agent) = self.redis.count(r)?;
        let some = |s: String| (!s.is_empty()).then_some(s);
        Ok(SessionHolders { tenant: some(tenant), agent: some(agent) })
    }

    /// Makes the session's tenant binding permanent: a room's session lives as long as the room,
    /// which never expires.
    pub async fn session_binding_persist(&self, session_id: &str) -> Result<(), StoreError> {
        let r: Result<(), _> = redis::pipe()
            .persist(self.redis.keys.session(session_id, "tenant"))
            .ignore()
            .persist(self.redis.keys.session(session_id, "agent"))
            .ignore()
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r)
    }

    /// The tenants of `sessions` (as `session_tenant`), in one pipeline.
    pub async fn session_tenants(&self, sessions: &[&str]) -> Result<Vec<Option<String>>, StoreError> {
        if sessions.is_empty() {
            return Ok(vec![]);
        }
        let mut pipe = redis::pipe();
        for id in sessions {
            pipe.get(self.redis.keys.session(id, "tenant"));
        }
        let r: Result<Vec<Option<String>>, _> = pipe.query_async(&mut self.redis.conn().await?).await;
        self.redis.count(r)
    }

    /// The session's tenant, if a turn bound it to one.
    pub async fn session_tenant(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        let r: Result<Option<String>, _> = redis::cmd("GET")
            .arg(self.redis.keys.session(session_id, "tenant"))
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r)
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
            inv.key(self.redis.keys.session(session_id, part));
        }
        inv.arg(execution_id)
            .arg(fence)
            .arg(format!("{execution_id}:compaction"))
            .arg(HISTORY_TTL_SECS)
            .arg(up_to_seq)
            .arg(serde_json::to_string(summary).expect("an entry serialises"));
        let r: Result<String, _> = inv.invoke_async(&mut self.redis.conn().await?).await;
        Ok(match self.redis.count(r)?.as_str() {
            "compacted" | "done" => CompactHistory::Done,
            _ => CompactHistory::NotHolder,
        })
    }

    /// Records which turn's call each client event names (`event id → call`), for the client's
    /// `tool_output` to be checked against.
    pub async fn put_client_calls(&self, session_id: &str, calls: &[(String, ClientCall)]) -> Result<(), StoreError> {
        let key = self.redis.keys.session(session_id, "client_calls");
        let mut pipe = redis::pipe();
        for (event_id, call) in calls {
            pipe.hset(&key, event_id, serde_json::to_string(call).expect("a call serialises")).ignore();
        }
        pipe.expire(&key, IDEMPOTENCY_TTL_SECS as i64).ignore();
        let r: Result<(), _> = pipe.query_async(&mut self.redis.conn().await?).await;
        self.redis.count(r)
    }

    /// The call a client event names, if it named one.
    pub async fn client_call(&self, session_id: &str, event_id: &str) -> Result<Option<ClientCall>, StoreError> {
        let r: Result<Option<String>, _> =
            self.redis.conn().await?.hget(self.redis.keys.session(session_id, "client_calls"), event_id).await;
        Ok(self.redis.count(r)?.and_then(|raw| serde_json::from_str(&raw).ok()))
    }

    /// Takes a turn that can no longer run out of its session (see `SESSION_ABANDON_LUA`); returns
    /// the turn to wake when the session is free.
    pub async fn session_abandon(&self, session_id: &str, execution_id: &str) -> Result<Option<String>, StoreError> {
        let r: Result<String, _> = SESSION_ABANDON_SCRIPT
            .key(self.redis.keys.session(session_id, "lock"))
            .key(self.redis.keys.session(session_id, "queue"))
            .key(self.redis.keys.session(session_id, "steer"))
            .arg(execution_id)
            .arg(IDEMPOTENCY_TTL_SECS)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        let next = self.redis.count(r)?;
        Ok((!next.is_empty()).then_some(next))
    }
}
