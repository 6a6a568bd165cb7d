//! Dead letters in Redis, their store of record: one key per record (the full record, a poison
//! body's excerpt included) and a time-ordered index, both under the `{dead_letters}` hash tag.
//! Every operation finds a dead letter by id; a short per-id lock keeps two operations (two
//! retries, a retry and a delete) from acting on one dead letter at once.

use std::time::Duration;

use redis::AsyncCommands;

use fleet_protocol::deadletter::{DeadLetterRecord, ListCursor};

use crate::store::{Store, StoreError};

// Built once: `Script::new` hashes its source.
static UNLOCK_SCRIPT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| redis::Script::new(UNLOCK_LUA));

/// Index entries dropped per trimming pass, so one save stays cheap.
const TRIM_BATCH: u64 = 500;

/// Frees a lock only if this holder still has it (one key).
const UNLOCK_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"#;

impl Store {
    /// Stores (or replaces) a dead letter and indexes it at `now_ms`, then trims the index.
    pub async fn save_dead_letter(&self, id: &str, record: &DeadLetterRecord, now_ms: i64) -> Result<(), StoreError> {
        let body = serde_json::to_string(record).expect("a record serialises");
        let r: Result<(), _> = redis::pipe()
            .set_ex(self.keys().dead_letter(id), body, self.retention_secs())
            .ignore()
            .zadd(self.keys().dead_letters_index(), id, now_ms)
            .ignore()
            .query_async(&mut self.conn().await?)
            .await;
        self.count(r)?;
        self.trim_dead_letters(now_ms).await.map(|_| ())
    }

    /// Stores a dead letter unless one with this id exists; `false` if it did.
    pub async fn insert_dead_letter(
        &self,
        id: &str,
        record: &DeadLetterRecord,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let body = serde_json::to_string(record).expect("a record serialises");
        let set: Result<Option<String>, _> = redis::cmd("SET")
            .arg(self.keys().dead_letter(id))
            .arg(body)
            .arg("NX")
            .arg("EX")
            .arg(self.retention_secs())
            .query_async(&mut self.conn().await?)
            .await;
        if self.count(set)?.is_none() {
            return Ok(false);
        }
        let r: Result<(), _> = self.conn().await?.zadd(self.keys().dead_letters_index(), id, now_ms).await;
        self.count(r)?;
        self.trim_dead_letters(now_ms).await?;
        Ok(true)
    }

    pub async fn get_dead_letter(&self, id: &str) -> Result<Option<DeadLetterRecord>, StoreError> {
        Ok(self.get_dead_letters(&[id.to_string()]).await?.pop().flatten())
    }

    /// The records of `ids`, in order; `None` where there is none.
    pub async fn get_dead_letters(&self, ids: &[String]) -> Result<Vec<Option<DeadLetterRecord>>, StoreError> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        let keys: Vec<String> = ids.iter().map(|id| self.keys().dead_letter(id)).collect();
        let raw: Result<Vec<Option<String>>, _> =
            redis::cmd("MGET").arg(&keys).query_async(&mut self.conn().await?).await;
        self.count(raw)?
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
        // Entries of the cursor's millisecond already returned are skipped below; fetch enough of
        // that millisecond to get past them.
        let mut page: Vec<(String, i64)> = Vec::new();
        let mut offset = 0;
        loop {
            let r: Result<Vec<(String, i64)>, _> = redis::cmd("ZREVRANGEBYSCORE")
                .arg(self.keys().dead_letters_index())
                .arg(&max)
                .arg("-inf")
                .arg("WITHSCORES")
                .arg("LIMIT")
                .arg(offset)
                .arg(limit)
                .query_async(&mut self.conn().await?)
                .await;
            let batch = self.count(r)?;
            let full = batch.len() == limit;
            offset += batch.len();
            page.extend(batch.into_iter().filter(|(id, at)| cursor.is_none_or(|c| c.precedes(*at, id))));
            if page.len() >= limit || !full {
                page.truncate(limit);
                return Ok(page);
            }
        }
    }

    /// Takes the per-id lock for `ttl`; `false` while another operation holds it.
    pub async fn lock_dead_letter(&self, id: &str, holder: &str, ttl: Duration) -> Result<bool, StoreError> {
        let r: Result<Option<String>, _> = redis::cmd("SET")
            .arg(self.keys().dead_letter_lock(id))
            .arg(holder)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query_async(&mut self.conn().await?)
            .await;
        Ok(self.count(r)?.is_some())
    }

    pub async fn unlock_dead_letter(&self, id: &str, holder: &str) -> Result<(), StoreError> {
        let r: Result<i64, _> =
            UNLOCK_SCRIPT.key(self.keys().dead_letter_lock(id)).arg(holder).invoke_async(&mut self.conn().await?).await;
        self.count(r).map(|_| ())
    }

    /// Removes a dead letter; `false` if there was none. Idempotent.
    pub async fn delete_dead_letter(&self, id: &str) -> Result<bool, StoreError> {
        let r: Result<(i64, i64), _> = redis::pipe()
            .del(self.keys().dead_letter(id))
            .zrem(self.keys().dead_letters_index(), id)
            .query_async(&mut self.conn().await?)
            .await;
        Ok(self.count(r)?.0 > 0)
    }

    /// Drops index entries whose record is gone (expired or removed by another process).
    pub async fn forget_dead_letters(&self, ids: &[String]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let r: Result<(), _> = self.conn().await?.zrem(self.keys().dead_letters_index(), ids).await;
        self.count(r)
    }

    /// Applies the retention: drops (index entry and record) every dead letter older than the
    /// retention and the oldest beyond the maximum count, up to one batch. Returns how many.
    pub async fn trim_dead_letters(&self, now_ms: i64) -> Result<u64, StoreError> {
        let policy = self.dead_letter_retention;
        let index = self.keys().dead_letters_index();
        let r: Result<(u64, u64), _> = redis::pipe()
            .cmd("ZCOUNT")
            .arg(&index)
            .arg("-inf")
            .arg(format!("({}", policy.cutoff_ms(now_ms)))
            .zcard(&index)
            .query_async(&mut self.conn().await?)
            .await;
        let (expired, count) = self.count(r)?;
        let n = policy.to_drop(expired, count, TRIM_BATCH);
        if n == 0 {
            return Ok(0);
        }
        let r: Result<Vec<String>, _> = self.conn().await?.zrange(&index, 0, n as isize - 1).await;
        let ids = self.count(r)?;
        let keys: Vec<String> = ids.iter().map(|id| self.keys().dead_letter(id)).collect();
        let r: Result<(), _> =
            redis::pipe().del(keys).ignore().zrem(&index, &ids).ignore().query_async(&mut self.conn().await?).await;
        self.count(r)?;
        Ok(ids.len() as u64)
    }

    /// How many dead letters the index holds.
    pub async fn count_dead_letters(&self) -> Result<u64, StoreError> {
        let r: Result<u64, _> = self.conn().await?.zcard(self.keys().dead_letters_index()).await;
        self.count(r)
    }

    fn retention_secs(&self) -> u64 {
        (self.dead_letter_retention.max_age_ms / 1000).max(1) as u64
    }
}
