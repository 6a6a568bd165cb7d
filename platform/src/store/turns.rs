//! Agent turns and sessions in Redis: a turn's state (fenced by its steps' claims), its tool-call
//! outcomes, and a session's line, lock and steer list. A session's keys share one hash tag and a
//! turn's keys share another, so every script here touches one slot.

use std::collections::HashMap;

use redis::AsyncCommands;

use fleet_protocol::turn::{CallOutcome, TurnState};
use fleet_protocol::IDEMPOTENCY_TTL_SECS;

use super::{Store, StoreError};

// Built once: `Script::new` hashes its source.
static TURN_FENCED_SAVE_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(TURN_FENCED_SAVE_LUA));
static SESSION_ENQUEUE_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(SESSION_ENQUEUE_LUA));
static SESSION_ACQUIRE_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(SESSION_ACQUIRE_LUA));
static SESSION_STEER_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(SESSION_STEER_LUA));
static SESSION_FINISH_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(SESSION_FINISH_LUA));
static SESSION_ABANDON_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(SESSION_ABANDON_LUA));

const SESSION_ENQUEUE_LUA: &str = r#"
if not redis.call('LPOS', KEYS[1], ARGV[1]) then redis.call('RPUSH', KEYS[1], ARGV[1]) end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"#;

// The lock has no lease: the turn holding it gives it back however it ends (finished, dead
// letter, delivery limit, cancelled); the TTL only collects the keys of a deleted fleet.
const SESSION_ACQUIRE_LUA: &str = r#"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then redis.call('EXPIRE', KEYS[1], ARGV[2]) return 'held' end
if holder then return 'busy' end
local head = redis.call('LINDEX', KEYS[2], 0)
if head and head ~= ARGV[1] then return 'queued' end
if head == ARGV[1] then redis.call('LPOP', KEYS[2]) end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 'acquired'
"#;

const SESSION_STEER_LUA: &str = r#"
local holder = redis.call('GET', KEYS[1])
if not holder or holder == ARGV[1] then return 0 end
for i = 3, #ARGV do redis.call('RPUSH', KEYS[3], ARGV[i]) end
redis.call('EXPIRE', KEYS[3], ARGV[2])
redis.call('LREM', KEYS[2], 0, ARGV[1])
return 1
"#;

const SESSION_FINISH_LUA: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'not_holder', ''} end
if redis.call('LLEN', KEYS[3]) > 0 then return {'steer', ''} end
redis.call('DEL', KEYS[1])
return {'released', redis.call('LINDEX', KEYS[2], 0) or ''}
"#;

// A turn that can no longer run leaves its session: out of the line, and if it held the lock,
// the lock is freed and the turns that steered into it go first in line, to run on their own.
const SESSION_ABANDON_LUA: &str = r#"
local holder = redis.call('GET', KEYS[1])
redis.call('LREM', KEYS[2], 0, ARGV[1])
if holder == ARGV[1] then
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
elseif holder then
  return ''
end
return redis.call('LINDEX', KEYS[2], 0) or ''
"#;

// KEYS: state, fence. ARGV: fence, ttl, state JSON ('' registers the fence only).
const TURN_FENCED_SAVE_LUA: &str = r#"
if tonumber(redis.call('GET', KEYS[2]) or '0') > tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
if ARGV[3] ~= '' then redis.call('SET', KEYS[1], ARGV[3], 'EX', ARGV[2]) end
return 1
"#;

/// What `session_acquire` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionSlot {
    /// This turn runs now (it was first in line, or already held the session).
    Acquired,
    /// Another turn runs, or is ahead in line.
    Wait,
}

/// What `session_finish` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionFinish {
    /// Released; the next turn in line (if any) should be woken.
    Released { next: Option<String> },
    /// Steer messages arrived meanwhile: the turn keeps the session and calls the model again.
    SteerPending,
    /// This turn does not hold the session (a finish already ran).
    NotHolder,
}

impl Store {
    /// Writes a turn's state with no fence (its creation by the dispatcher).
    pub async fn save_turn(&self, execution_id: &str, state: &TurnState) -> Result<(), StoreError> {
        let json = serde_json::to_string(state).expect("a turn state serialises");
        let r: Result<(), _> =
            self.conn().await?.set_ex(self.keys.turn(execution_id), json, IDEMPOTENCY_TTL_SECS).await;
        self.count(r)
    }

    /// Writes a turn's state under `fence` (`step_fence`); `false`: a newer step wrote already,
    /// nothing was written. With `state` absent it only registers the fence, so no older step
    /// writes from then on.
    pub async fn save_turn_fenced(
        &self,
        execution_id: &str,
        state: Option<&TurnState>,
        fence: u64,
    ) -> Result<bool, StoreError> {
        let json = state.map(|s| serde_json::to_string(s).expect("a turn state serialises")).unwrap_or_default();
        let r: Result<i64, _> = TURN_FENCED_SAVE_SCRIPT
            .key(self.keys.turn(execution_id))
            .key(self.keys.turn_fence(execution_id))
            .arg(fence)
            .arg(IDEMPOTENCY_TTL_SECS)
            .arg(json)
            .invoke_async(&mut self.conn().await?)
            .await;
        Ok(self.count(r)? == 1)
    }

    pub async fn load_turn(&self, execution_id: &str) -> Result<Option<TurnState>, StoreError> {
        let raw: Result<Option<String>, _> = self.conn().await?.get(self.keys.turn(execution_id)).await;
        self.count(raw)?
            .map(|raw| serde_json::from_str(&raw).map_err(|e| StoreError::Corrupt(format!("turn {execution_id}: {e}"))))
            .transpose()
    }

    /// Opens a dead-lettered turn again for a replay: its fence is cleared, it is no longer marked
    /// dead-lettered, and it takes its place at the end of its session's line. Returns false if the
    /// turn's state is gone.
    pub async fn reopen_turn(&self, execution_id: &str) -> Result<bool, StoreError> {
        let Some(mut state) = self.load_turn(execution_id).await? else { return Ok(false) };
        state.dead_lettered = false;
        let r: Result<(), _> = self.conn().await?.del(self.keys.turn_fence(execution_id)).await;
        self.count(r)?;
        self.save_turn(execution_id, &state).await?;
        self.session_enqueue(&state.session_id, execution_id).await?;
        Ok(true)
    }

    /// Records a tool call's outcome (the first one wins); returns whether this one was the first,
    /// and every outcome so far.
    pub async fn record_call_outcome(
        &self,
        turn_execution_id: &str,
        call_id: &str,
        outcome: &CallOutcome,
    ) -> Result<(bool, HashMap<String, CallOutcome>), StoreError> {
        let key = self.keys.turn_results(turn_execution_id);
        let json = serde_json::to_string(outcome).expect("an outcome serialises");
        let r: Result<(bool, HashMap<String, String>), _> = redis::pipe()
            .hset_nx(&key, call_id, json)
            .expire(&key, IDEMPOTENCY_TTL_SECS as i64)
            .ignore()
            .hgetall(&key)
            .query_async(&mut self.conn().await?)
            .await;
        let (first, all) = self.count(r)?;
        Ok((first, all.into_iter().filter_map(|(k, v)| serde_json::from_str(&v).ok().map(|o| (k, o))).collect()))
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

    /// Takes (or keeps) the session for `execution_id` if it is its turn. The lock is held until
    /// the turn gives it back (`session_finish`, `session_abandon`), however long its tools take.
    pub async fn session_acquire(&self, session_id: &str, execution_id: &str) -> Result<SessionSlot, StoreError> {
        let r: Result<String, _> = SESSION_ACQUIRE_SCRIPT
            .key(self.keys.session(session_id, "lock"))
            .key(self.keys.session(session_id, "queue"))
            .arg(execution_id)
            .arg(IDEMPOTENCY_TTL_SECS)
            .invoke_async(&mut self.conn().await?)
            .await;
        Ok(match self.count(r)?.as_str() {
            "acquired" | "held" => SessionSlot::Acquired,
            _ => SessionSlot::Wait,
        })
    }

    /// If another turn holds the session, hands it `steers` (JSON `Steer`s) for its next model
    /// call and returns true; false means nothing runs, so the steer runs as a turn of its own.
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
            .arg(execution_id)
            .arg(IDEMPOTENCY_TTL_SECS);
        for s in steers {
            inv.arg(s);
        }
        let r: Result<i64, _> = inv.invoke_async(&mut self.conn().await?).await;
        Ok(self.count(r)? == 1)
    }

    /// Takes the steer entries waiting for the running turn.
    pub async fn session_take_steer(&self, session_id: &str) -> Result<Vec<String>, StoreError> {
        let key = self.keys.session(session_id, "steer");
        let r: Result<(Vec<String>,), _> =
            redis::pipe().atomic().lrange(&key, 0, -1).del(&key).ignore().query_async(&mut self.conn().await?).await;
        Ok(self.count(r)?.0)
    }

    pub async fn session_finish(&self, session_id: &str, execution_id: &str) -> Result<SessionFinish, StoreError> {
        let r: Result<(String, String), _> = SESSION_FINISH_SCRIPT
            .key(self.keys.session(session_id, "lock"))
            .key(self.keys.session(session_id, "queue"))
            .key(self.keys.session(session_id, "steer"))
            .arg(execution_id)
            .invoke_async(&mut self.conn().await?)
            .await;
        let (state, next) = self.count(r)?;
        Ok(match state.as_str() {
            "steer" => SessionFinish::SteerPending,
            "released" => SessionFinish::Released { next: (!next.is_empty()).then_some(next) },
            _ => SessionFinish::NotHolder,
        })
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
