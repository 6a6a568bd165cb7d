//! A session's conversation history in Redis: one list of JSON entries (oldest first) under the
//! session's hash tag, with a sequence counter for stable cursors and a set of the turns already
//! appended, so a finish that runs twice appends once. Which entries the budget drops is decided by
//! `fleet_protocol::history::entries_to_drop`.

use crate::store::script::Lua;
use redis::AsyncCommands;

use fleet_protocol::history::{entries_to_drop, HistoryEntry, HISTORY_TTL_SECS, SESSION_BINDING_TTL_SECS};

use super::Sessions;
use crate::store::StoreError;

/// Drops the oldest `ARGV[2]` entries if the list still starts with `ARGV[1]` (nothing changed it
/// since the caller read it), and sets its byte count to what remains (`ARGV[3]`; a count kept
/// before the list had one is right from then on). KEYS: history, its byte count.
const TRIM_LUA: &str = include_str!("lua/trim.lua");

static TRIM: Lua = Lua::new(|| crate::store::script::load(&[TRIM_LUA]));

impl Sessions {
    /// Drops the oldest whole exchanges beyond `max_messages` / `max_bytes` from the session's
    /// history (read whole only when a finish said it is over budget).
    pub async fn trim_history(
        &self,
        session_id: &str,
        max_messages: usize,
        max_bytes: usize,
    ) -> Result<(), StoreError> {
        let key = self.redis.keys().session(session_id, "history");
        let raw: Result<Vec<String>, _> = self.redis.conn().await?.lrange(&key, 0, -1).await;
        let raw = self.redis.count(raw)?;
        let sized: Vec<(String, usize)> = raw.iter().map(|s| (exchange_of(s), s.len())).collect();
        let view: Vec<(&str, usize)> = sized.iter().map(|(x, n)| (x.as_str(), *n)).collect();
        let drop = entries_to_drop(&view, max_messages, max_bytes);
        if drop == 0 {
            return Ok(());
        }
        let remaining: usize = raw[drop..].iter().map(String::len).sum();
        let r: Result<i64, _> = TRIM
            .key(&key)
            .key(self.redis.keys().session(session_id, "history_bytes"))
            .arg(&raw[0])
            .arg(drop)
            .arg(remaining)
            .arg(HISTORY_TTL_SECS)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r).map(|_| ())
    }

    /// The session's history, oldest first; reading it refreshes its TTL.
    pub async fn history(&self, session_id: &str) -> Result<Vec<HistoryEntry>, StoreError> {
        let key = self.redis.keys().session(session_id, "history");
        let r: Result<(Vec<String>,), _> = redis::pipe()
            .atomic()
            .lrange(&key, 0, -1)
            .expire(&key, HISTORY_TTL_SECS as i64)
            .ignore()
            .expire(self.redis.keys().session(session_id, "history_seq"), HISTORY_TTL_SECS as i64)
            .ignore()
            // The guards of what this read renewed are renewed with it (never shortened).
            .cmd("EXPIRE")
            .arg(self.redis.keys().session(session_id, "tenant"))
            .arg(SESSION_BINDING_TTL_SECS)
            .arg("GT")
            .ignore()
            .cmd("EXPIRE")
            .arg(self.redis.keys().session(session_id, "agent"))
            .arg(SESSION_BINDING_TTL_SECS)
            .arg("GT")
            .ignore()
            .query_async(&mut self.redis.conn().await?)
            .await;
        Ok(parse_entries(&self.redis.count(r)?.0))
    }

    /// Remembers the newest output of each of `outputs`' tool configurations (seed 001), which a
    /// later turn's `$ref` to `tool_outputs.NAME` reads; kept as long as the history.
    pub async fn remember_tool_outputs(
        &self,
        session_id: &str,
        outputs: &[(String, serde_json::Value)],
    ) -> Result<(), StoreError> {
        if outputs.is_empty() {
            return Ok(());
        }
        let key = self.redis.keys().session(session_id, "tool_outputs");
        let fields: Vec<(&str, String)> = outputs.iter().map(|(k, v)| (k.as_str(), v.to_string())).collect();
        let r: Result<(), _> = redis::pipe()
            .hset_multiple(&key, &fields)
            .ignore()
            .expire(&key, HISTORY_TTL_SECS as i64)
            .ignore()
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r)
    }

    /// The newest output of each tool configuration the session's earlier turns called.
    pub async fn tool_outputs(
        &self,
        session_id: &str,
    ) -> Result<std::collections::HashMap<String, serde_json::Value>, StoreError> {
        let key = self.redis.keys().session(session_id, "tool_outputs");
        let r: Result<std::collections::HashMap<String, String>, _> = self.redis.conn().await?.hgetall(&key).await;
        let raw = self.redis.count(r)?;
        Ok(raw.into_iter().filter_map(|(k, v)| Some((k, serde_json::from_str(&v).ok()?))).collect())
    }

    /// Forgets the session's history, its message log and its step (seed 001). The sequence counters stay (they expire
    /// on their own), so a cursor from before never names a later message.
    pub async fn history_delete(&self, session_id: &str) -> Result<(), StoreError> {
        let r: Result<(), _> = self
            .redis
            .conn()
            .await?
            .del(&[
                self.redis.keys().session(session_id, "history"),
                self.redis.keys().session(session_id, "history_turns"),
                self.redis.keys().session(session_id, "history_bytes"),
                self.redis.keys().session(session_id, "messages"),
                self.redis.keys().session(session_id, "messages_ids"),
                self.redis.keys().session(session_id, "step"),
                self.redis.keys().session(session_id, "tool_outputs"),
            ])
            .await;
        self.redis.count(r)
    }
}

/// The exchange (turn) an entry belongs to; an unreadable entry is its own exchange, so it is
/// dropped first and alone.
fn exchange_of(raw: &str) -> String {
    serde_json::from_str::<HistoryEntry>(raw).map(|e| e.exchange).unwrap_or_default()
}

/// History entries as stored; an unreadable one is skipped, not fatal: it must not stop every
/// later turn of the session.
pub(crate) fn parse_entries(raw: &[String]) -> Vec<HistoryEntry> {
    raw.iter()
        .filter_map(|s| match serde_json::from_str(s) {
            Ok(entry) => Some(entry),
            Err(e) => {
                tracing::warn!(error = %e, "skipping an unreadable history entry");
                None
            }
        })
        .collect()
}
