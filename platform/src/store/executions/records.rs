//! Execution records as read and written outside a job's life (`life.rs` holds the life): a new
//! record's fields, the view the API shows, a removal, the newest pickup per kind, and the move of
//! a record written before records sat beside their claims.

use serde_json::Value;

use fleet_protocol::execution::{field, AttemptRecord, ExecutionRecord};
use fleet_protocol::external_result::ExternalResult;
use fleet_protocol::IDEMPOTENCY_TTL_SECS;

use super::Executions;
use crate::store::StoreError;

/// An execution as read back: its record, with its result and attempts (kept beside it).
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionView {
    pub record: ExecutionRecord,
    pub result: Option<Value>,
    pub attempts: Vec<AttemptRecord>,
    /// Seed 002's structured result: the tool's own, else what a dead-lettered or cancelled tool
    /// call's record says.
    pub external_result: Option<ExternalResult>,
}

/// A record as kept before it moved beside its claim: its hash, attempts, turn state and results.
type LegacyExecution =
    (std::collections::HashMap<String, String>, Vec<String>, Option<String>, std::collections::HashMap<String, String>);

/// Reads a record's hash and attempt entries into its view.
pub(crate) fn execution_view(
    execution_id: &str,
    hash: &std::collections::HashMap<String, String>,
    attempts: &[String],
) -> Result<ExecutionView, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("execution {execution_id}: {what}"));
    let record = ExecutionRecord::from_fields(execution_id, hash).map_err(corrupt)?;
    let result = match hash.get(field::RESULT) {
        Some(raw) => Some(serde_json::from_str(raw).map_err(|_| corrupt("result"))?),
        None => None,
    };
    let attempts = attempts
        .iter()
        .map(|a| serde_json::from_str(a).map_err(|_| corrupt("attempt")))
        .collect::<Result<Vec<AttemptRecord>, _>>()?;
    let external_result = match hash.get(field::EXTERNAL_RESULT) {
        Some(raw) => Some(serde_json::from_str(raw).map_err(|_| corrupt("external_result"))?),
        None => ExternalResult::of_record(&record, &attempts),
    };
    Ok(ExecutionView { record, result, attempts, external_result })
}

impl Executions {
    /// The tenant on each of `ids`' execution records (`None`: no record, or none recorded), in
    /// one pipeline.
    pub async fn execution_tenants(&self, ids: &[&str]) -> Result<Vec<Option<String>>, StoreError> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.hget(self.redis.keys.execution(id), field::TENANT);
        }
        let r: Result<Vec<Option<String>>, _> = pipe.query_async(&mut self.redis.conn().await?).await;
        self.redis.count(r)
    }

    /// Notes that a worker picked up a job of `kind` that entered its work queue at `entered_ms`:
    /// the newest such time per kind (with the queue's depth, the oldest waiting job's age).
    pub async fn note_pickup(&self, kind: &str, entered_ms: i64) -> Result<(), StoreError> {
        let r: Result<(), _> = redis::cmd("ZADD")
            .arg(self.redis.keys.pickups())
            .arg("GT")
            .arg(entered_ms)
            .arg(kind)
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r)
    }

    /// When the newest job a worker picked up of each kind entered its work queue (ms).
    pub async fn pickups(&self) -> Result<std::collections::HashMap<String, i64>, StoreError> {
        let r: Result<Vec<(String, i64)>, _> = redis::cmd("ZRANGE")
            .arg(self.redis.keys.pickups())
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)?.into_iter().collect())
    }

    /// Removes a record whose job was never accepted (the publish failed).
    pub async fn delete_execution(&self, execution_id: &str) -> Result<(), StoreError> {
        let r: Result<(), _> = redis::pipe()
            .del(self.redis.keys.execution(execution_id))
            .ignore()
            .del(self.redis.keys.attempts(execution_id))
            .ignore()
            .del(self.redis.keys.turn(execution_id))
            .ignore()
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r)
    }

    /// An execution's record and attempts; one written before records moved beside their claims
    /// is read where it was.
    pub async fn get_execution(&self, execution_id: &str) -> Result<Option<ExecutionView>, StoreError> {
        let layouts = [
            (self.redis.keys.execution(execution_id), self.redis.keys.attempts(execution_id)),
            (self.redis.keys.legacy_execution(execution_id), self.redis.keys.legacy_attempts(execution_id)),
        ];
        for (record, attempts) in layouts {
            if let Some(view) = self.read_execution(execution_id, &record, &attempts).await? {
                return Ok(Some(view));
            }
        }
        Ok(None)
    }

    /// An execution's record as kept before records moved beside their claims, if there is one.
    pub(crate) async fn get_legacy_execution(&self, execution_id: &str) -> Result<Option<ExecutionView>, StoreError> {
        let (record, attempts) =
            (self.redis.keys.legacy_execution(execution_id), self.redis.keys.legacy_attempts(execution_id));
        self.read_execution(execution_id, &record, &attempts).await
    }

    /// The record at `record` with its attempts at `attempts`, if it exists.
    async fn read_execution(
        &self,
        execution_id: &str,
        record: &str,
        attempts: &str,
    ) -> Result<Option<ExecutionView>, StoreError> {
        let r: Result<(std::collections::HashMap<String, String>, Vec<String>), _> =
            redis::pipe().hgetall(record).lrange(attempts, 0, -1).query_async(&mut self.redis.conn().await?).await;
        let (hash, attempts) = self.redis.count(r)?;
        if hash.is_empty() {
            return Ok(None);
        }
        execution_view(execution_id, &hash, &attempts).map(Some)
    }

    /// Moves a record written before records moved beside their claims (with its attempts, and a
    /// turn's state and tool results) into its claim's slot, with the step its status implies;
    /// `false` if there is none. Copied, not renamed: the old keys are in another slot.
    pub async fn migrate_legacy(&self, execution_id: &str) -> Result<bool, StoreError> {
        let keys = &self.redis.keys;
        let r: Result<LegacyExecution, _> = redis::pipe()
            .hgetall(keys.legacy_execution(execution_id))
            .lrange(keys.legacy_attempts(execution_id), 0, -1)
            .get(keys.legacy_turn(execution_id))
            .hgetall(keys.legacy_turn_results(execution_id))
            .query_async(&mut self.redis.conn().await?)
            .await;
        let (mut hash, attempts, turn, results) = self.redis.count(r)?;
        if hash.is_empty() {
            return Ok(false);
        }
        let round = turn
            .as_deref()
            .and_then(|t| serde_json::from_str::<fleet_protocol::turn::TurnState>(t).ok())
            .map_or(0, |t| t.round);
        let n = hash.get(field::ATTEMPTS).and_then(|a| a.parse::<u32>().ok()).unwrap_or(0);
        let attempt = match hash.get(field::STATUS).map(String::as_str) {
            Some("retrying") => n + 1,
            _ => n.max(1),
        };
        hash.entry(field::STEP_ROUND.into()).or_insert_with(|| round.to_string());
        hash.entry(field::STEP_ATTEMPT.into()).or_insert_with(|| attempt.to_string());
        let ttl = IDEMPOTENCY_TTL_SECS as i64;
        let mut pipe = redis::pipe();
        pipe.atomic();
        let fields: Vec<(String, String)> = hash.into_iter().collect();
        pipe.hset_multiple(keys.execution(execution_id), &fields)
            .ignore()
            .expire(keys.execution(execution_id), ttl)
            .ignore();
        if !attempts.is_empty() {
            pipe.rpush(keys.attempts(execution_id), &attempts)
                .ignore()
                .expire(keys.attempts(execution_id), ttl)
                .ignore();
        }
        if let Some(turn) = turn {
            pipe.set_ex(keys.turn(execution_id), turn, IDEMPOTENCY_TTL_SECS).ignore();
        }
        if !results.is_empty() {
            let results: Vec<(String, String)> = results.into_iter().collect();
            pipe.hset_multiple(keys.turn_results(execution_id), &results)
                .ignore()
                .expire(keys.turn_results(execution_id), ttl)
                .ignore();
        }
        let r: Result<(), _> = pipe.query_async(&mut self.redis.conn().await?).await;
        self.redis.count(r)?;
        Ok(true)
    }
}
