//! What the operator console keeps in Redis: login sessions and a bulk operation's progress, each
//! a small hash that expires on its own (one key per operation: any dispatcher can read it).

use std::collections::HashMap;

use super::ConsoleIndex;
use crate::store::StoreError;

impl ConsoleIndex {
    /// Writes (or extends) the hash `key` with `fields`, living `ttl_secs`.
    async fn put_hash(&self, key: String, fields: &[(&str, String)], ttl_secs: u64) -> Result<(), StoreError> {
        let r: Result<(), _> = redis::pipe()
            .atomic()
            .hset_multiple(&key, fields)
            .ignore()
            .expire(&key, ttl_secs as i64)
            .ignore()
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r)
    }

    async fn read_hash(&self, key: String) -> Result<HashMap<String, String>, StoreError> {
        let r: Result<HashMap<String, String>, _> =
            redis::cmd("HGETALL").arg(key).query_async(&mut self.redis.conn().await?).await;
        self.redis.count(r)
    }

    pub async fn console_session_put(
        &self,
        id: &str,
        fields: &[(&str, String)],
        ttl_secs: u64,
    ) -> Result<(), StoreError> {
        self.put_hash(self.redis.keys().console_session(id), fields, ttl_secs).await
    }

    /// A session's fields (empty once it expired or was ended).
    pub async fn console_session(&self, id: &str) -> Result<HashMap<String, String>, StoreError> {
        self.read_hash(self.redis.keys().console_session(id)).await
    }

    pub async fn console_session_end(&self, id: &str) -> Result<(), StoreError> {
        let r: Result<(), _> = redis::cmd("DEL")
            .arg(self.redis.keys().console_session(id))
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r)
    }

    /// Failed console logins from `source` in the current window (which the first one opened).
    pub async fn console_login_failures(&self, source: &str) -> Result<u64, StoreError> {
        let r: Result<Option<u64>, _> = redis::cmd("GET")
            .arg(self.redis.keys().console_login_failures(source))
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r).map(Option::unwrap_or_default)
    }

    /// Counts a failed console login from `source`; a window of `window_secs` opens with the first.
    pub async fn console_login_failed(&self, source: &str, window_secs: u64) -> Result<(), StoreError> {
        let key = self.redis.keys().console_login_failures(source);
        let r: Result<(), _> = redis::pipe()
            .atomic()
            .incr(&key, 1)
            .ignore()
            .cmd("EXPIRE")
            .arg(&key)
            .arg(window_secs)
            .arg("NX")
            .ignore()
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r)
    }

    pub async fn console_job_put(&self, id: &str, fields: &[(&str, String)], ttl_secs: u64) -> Result<(), StoreError> {
        self.put_hash(self.redis.keys().console_job(id), fields, ttl_secs).await
    }

    pub async fn console_job(&self, id: &str) -> Result<HashMap<String, String>, StoreError> {
        self.read_hash(self.redis.keys().console_job(id)).await
    }
}
