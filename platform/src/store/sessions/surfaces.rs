//! A session's listeners in Redis: one sorted set under the session's hash tag, each entry an open
//! stream's surface (`fleet_protocol::surfaces::Surface::listener_entry`) scored by the moment it
//! stops counting. An open stream refreshes its entry and removes it when it ends; a dispatcher
//! that dies leaves entries that lapse on their own, and the set itself expires once every entry
//! it could hold has.

use std::time::Duration;

use super::Sessions;
use crate::store::StoreError;

impl Sessions {
    /// Registers `entry` as listening to the session for `ttl` from now (again: a refresh), and
    /// drops the entries that lapsed.
    pub async fn listen(&self, session_id: &str, entry: &str, ttl: Duration) -> Result<(), StoreError> {
        let key = self.redis.keys().session(session_id, "surfaces");
        let now = crate::now_ms();
        let ttl_ms = ttl.as_millis() as i64;
        let r: Result<(), _> = redis::pipe()
            .atomic()
            .zadd(&key, entry, now + ttl_ms)
            .ignore()
            .zrembyscore(&key, "-inf", now)
            .ignore()
            // Each entry lapses at most `ttl` after the latest write: the set needs no longer.
            .pexpire(&key, ttl_ms)
            .ignore()
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r)
    }

    /// Removes `entry` (its stream ended); other streams of the same surface keep theirs.
    pub async fn stop_listening(&self, session_id: &str, entry: &str) -> Result<(), StoreError> {
        let key = self.redis.keys().session(session_id, "surfaces");
        let r: Result<(), _> = redis::cmd("ZREM").arg(&key).arg(entry).query_async(&mut self.redis.conn().await?).await;
        self.redis.count(r)
    }

    /// The entries listening now (lapsed ones are left out).
    pub async fn listeners(&self, session_id: &str) -> Result<Vec<String>, StoreError> {
        let key = self.redis.keys().session(session_id, "surfaces");
        let r: Result<Vec<String>, _> = redis::cmd("ZRANGE")
            .arg(&key)
            .arg(crate::now_ms())
            .arg("+inf")
            .arg("BYSCORE")
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r)
    }
}
