//! Dead letters in Redis, their store of record: one key per record (the full record, a poison
//! body's excerpt included) and a time-ordered index, both under the `{dead_letters}` hash tag.
//! Every operation finds a dead letter by id; a short per-id lock keeps two operations (two
//! retries, a retry and a delete) from acting on one dead letter at once.

use crate::store::script::Lua;
use std::time::Duration;

use redis::AsyncCommands;

use fleet_protocol::dead_letters::{DeadLetterRecord, ListCursor};
use fleet_protocol::keys;

use super::DeadLetters;
use crate::store::StoreError;

static UNLOCK_SCRIPT: Lua = Lua::new(|| crate::store::script::load(&[UNLOCK_LUA]));
static ADD_SCRIPT: Lua = Lua::new(|| crate::store::script::load(&[COUNT_LUA, ADD_LUA]));
static REMOVE_SCRIPT: Lua = Lua::new(|| crate::store::script::load(&[COUNT_LUA, DROP_LUA, REMOVE_LUA]));
static TRIM_SCRIPT: Lua = Lua::new(|| crate::store::script::load(&[COUNT_LUA, DROP_LUA, TRIM_LUA]));

/// Index entries dropped per trimming pass, so one save stays cheap.
const TRIM_BATCH: u64 = 500;

/// Frees a lock only if this holder still has it (one key).
const UNLOCK_LUA: &str = include_str!("lua/unlock.lua");

/// Moves the counts of one facet (`reason` TAB `tool`) by `d`; a count at zero is dropped so the
/// hash stays as small as the set of reasons and tools in use. Field names as
/// `fleet_protocol::keys::dead_letter_count_field` builds them.
const COUNT_LUA: &str = include_str!("lua/count.lua");

/// Stores a dead letter (KEYS: record, index, facets, counts; ARGV: id, body, ttl, at, facet,
/// replace): unless `replace`, only if none exists (returns 0). Indexes it and counts its facet,
/// uncounting the facet of the record it replaces.
const ADD_LUA: &str = include_str!("lua/add.lua");

/// Drops one dead letter (its record, index entry, facet and counts); answers whether its record
/// existed.
const DROP_LUA: &str = include_str!("lua/drop.lua");

/// Removes dead letters (KEYS: index, facets, counts, then each record; ARGV: the ids): record,
/// index entry, facet and counts together. Returns how many records existed, per id.
const REMOVE_LUA: &str = include_str!("lua/remove.lua");

/// Drops the oldest entries a trim chose (KEYS: index, facets, counts, then each record; ARGV:
/// the cutoff ms, the maximum count, then the ids, oldest first), each only if it is still due:
/// past the cutoff, or the index still over its maximum. Saves trim at once (a worker's
/// concurrent dead letters, the dispatcher's drain): a trim that counted entries another has
/// dropped since must not take the next oldest, which are live. Returns how many it dropped.
const TRIM_LUA: &str = include_str!("lua/trim.lua");

impl DeadLetters {
    /// Stores (or replaces) a dead letter and indexes it at `now_ms`, then trims the index.
    pub async fn save_dead_letter(&self, id: &str, record: &DeadLetterRecord, now_ms: i64) -> Result<(), StoreError> {
        self.add_dead_letter(id, record, now_ms, true).await?;
        self.trim_dead_letters(now_ms).await.map(|_| ())
    }

    /// Stores a dead letter unless one with this id exists; `false` if it did.
    pub async fn insert_dead_letter(
        &self,
        id: &str,
        record: &DeadLetterRecord,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        if !self.add_dead_letter(id, record, now_ms, false).await? {
            return Ok(false);
        }
        self.trim_dead_letters(now_ms).await?;
        Ok(true)
    }

    /// One script: the record, its index entry and its counts (see `ADD_LUA`).
    async fn add_dead_letter(
        &self,
        id: &str,
        record: &DeadLetterRecord,
        now_ms: i64,
        replace: bool,
    ) -> Result<bool, StoreError> {
        let stamped;
        let record = match (&record.tenant, &record.execution_id) {
            // Stamped with its execution's tenant, which then guards it for as long as it is kept
            // (the execution's record expires sooner). A rare path: one more read is nothing.
            (None, Some(execution)) => {
                let tenant = self.executions.execution_tenants(&[execution]).await?.pop().flatten();
                stamped = DeadLetterRecord { tenant, ..record.clone() };
                &stamped
            }
            _ => record,
        };
        let body = serde_json::to_string(record).expect("a record serialises");
        let k = self.redis.keys();
        let facet = keys::dead_letter_facet(record.reason.as_str(), record.tool_name.as_deref());
        let r: Result<i64, _> = ADD_SCRIPT
            .key(k.dead_letter(id))
            .key(k.dead_letters_index())
            .key(k.dead_letters_facets())
            .key(k.dead_letters_counts())
            .arg(id)
            .arg(body)
            .arg(self.retention_secs())
            .arg(now_ms)
            .arg(facet)
            .arg(if replace { "1" } else { "0" })
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)? == 1)
    }

    /// Removes dead letters with their index entries and counts; per id, whether a record existed.
    async fn remove_dead_letters(&self, ids: &[String]) -> Result<Vec<bool>, StoreError> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        let r: Result<Vec<i64>, _> =
            self.on_each(&REMOVE_SCRIPT, &[], ids).invoke_async(&mut self.redis.conn().await?).await;
        Ok(self.redis.count(r)?.into_iter().map(|n| n > 0).collect())
    }

    /// `script` on dead letters `ids`: KEYS the index, facets, counts, then each record; ARGV
    /// `args`, then the ids (the layout `REMOVE_LUA` and `TRIM_LUA` read).
    fn on_each<'a>(&self, script: &'a redis::Script, args: &[i64], ids: &[String]) -> redis::ScriptInvocation<'a> {
        let k = self.redis.keys();
        let mut invocation = script.key(k.dead_letters_index());
        invocation.key(k.dead_letters_facets()).key(k.dead_letters_counts());
        for arg in args {
            invocation.arg(arg);
        }
        for id in ids {
            invocation.key(k.dead_letter(id)).arg(id);
        }
        invocation
    }

    /// How many indexed dead letters have this reason and tool (either may be any), from the
    /// counts the scripts keep: `None` when the counts do not cover the whole index (dead letters
    /// stored before the counts existed), so the caller must count another way.
    pub async fn count_dead_letters_by(
        &self,
        reason: Option<&str>,
        tool: Option<&str>,
    ) -> Result<Option<u64>, StoreError> {
        let k = self.redis.keys();
        let r: Result<(u64, Option<u64>, Option<u64>), _> = redis::pipe()
            .zcard(k.dead_letters_index())
            .hget(k.dead_letters_counts(), "all")
            .hget(k.dead_letters_counts(), keys::dead_letter_count_field(reason, tool))
            .query_async(&mut self.redis.conn().await?)
            .await;
        let (indexed, all, n) = self.redis.count(r)?;
        Ok((all.unwrap_or(0) == indexed).then_some(n.unwrap_or(0)))
    }

    pub async fn get_dead_letter(&self, id: &str) -> Result<Option<DeadLetterRecord>, StoreError> {
        Ok(self.get_dead_letters(&[id.to_string()]).await?.pop().flatten())
    }

    /// The records of `ids`, in order; `None` where there is none.
    pub async fn get_dead_letters(&self, ids: &[String]) -> Result<Vec<Option<DeadLetterRecord>>, StoreError> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        let keys: Vec<String> = ids.iter().map(|id| self.redis.keys().dead_letter(id)).collect();
        let raw: Result<Vec<Option<String>>, _> =
            redis::cmd("MGET").arg(&keys).query_async(&mut self.redis.conn().await?).await;
        self.redis
            .count(raw)?
            .into_iter()
            .zip(ids)
            .map(|(raw, id)| {
                raw.map(|raw| {
                    serde_json::from_str(&raw).map_err(|e| StoreError::Corrupt(format!("dead letter {id}: {e}")))
                })
                .transpose()
            })
            .collect()
    }

    /// Index entries newest first (ties by id, descending), after `cursor` if given.
    pub async fn list_dead_letters(
        &self,
        cursor: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let max = cursor.map(|c| c.at_ms.to_string()).unwrap_or_else(|| "+inf".into());
        self.redis.zset_newest_first(&self.redis.keys().dead_letters_index(), &max, "-inf", cursor, limit).await
    }

    /// Takes the per-id lock for `ttl`; `false` while another operation holds it.
    pub async fn lock_dead_letter(&self, id: &str, holder: &str, ttl: Duration) -> Result<bool, StoreError> {
        let r: Result<Option<String>, _> = redis::cmd("SET")
            .arg(self.redis.keys().dead_letter_lock(id))
            .arg(holder)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)?.is_some())
    }

    pub async fn unlock_dead_letter(&self, id: &str, holder: &str) -> Result<(), StoreError> {
        let r: Result<i64, _> = UNLOCK_SCRIPT
            .key(self.redis.keys().dead_letter_lock(id))
            .arg(holder)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r).map(|_| ())
    }

    /// Removes a dead letter; `false` if there was none. Idempotent.
    pub async fn delete_dead_letter(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.remove_dead_letters(&[id.to_string()]).await?.first().copied().unwrap_or(false))
    }

    /// Drops index entries whose record is gone (expired or removed by another process).
    pub async fn forget_dead_letters(&self, ids: &[String]) -> Result<(), StoreError> {
        self.remove_dead_letters(ids).await.map(|_| ())
    }

    /// Applies the retention: drops (index entry and record) every dead letter older than the
    /// retention and the oldest beyond the maximum count, up to one batch. Returns how many.
    pub async fn trim_dead_letters(&self, now_ms: i64) -> Result<u64, StoreError> {
        let policy = self.retention;
        let index = self.redis.keys().dead_letters_index();
        let r: Result<(u64, u64), _> = redis::pipe()
            .cmd("ZCOUNT")
            .arg(&index)
            .arg("-inf")
            .arg(format!("({}", policy.cutoff_ms(now_ms)))
            .zcard(&index)
            .query_async(&mut self.redis.conn().await?)
            .await;
        let (expired, count) = self.redis.count(r)?;
        let n = policy.to_drop(expired, count, TRIM_BATCH);
        if n == 0 {
            return Ok(0);
        }
        let r: Result<Vec<String>, _> = self.redis.conn().await?.zrange(&index, 0, n as isize - 1).await;
        let ids = self.redis.count(r)?;
        if ids.is_empty() {
            return Ok(0);
        }
        let args = [policy.cutoff_ms(now_ms), policy.max_count as i64];
        let r: Result<u64, _> =
            self.on_each(&TRIM_SCRIPT, &args, &ids).invoke_async(&mut self.redis.conn().await?).await;
        self.redis.count(r)
    }

    /// How many dead letters were made since `since_ms`.
    pub async fn dead_letters_since(&self, since_ms: i64) -> Result<u64, StoreError> {
        let r: Result<u64, _> = redis::cmd("ZCOUNT")
            .arg(self.redis.keys().dead_letters_index())
            .arg(since_ms)
            .arg("+inf")
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r)
    }

    /// How many dead letters the index holds.
    pub async fn count_dead_letters(&self) -> Result<u64, StoreError> {
        let r: Result<u64, _> = self.redis.conn().await?.zcard(self.redis.keys().dead_letters_index()).await;
        self.redis.count(r)
    }

    fn retention_secs(&self) -> u64 {
        (self.retention.max_age_ms / 1000).max(1) as u64
    }
}
