//! A session's conversation history in Redis: one list of JSON entries (oldest first) under the
//! session's hash tag, with a sequence counter for stable cursors and a set of the turns already
//! appended, so a finish that runs twice appends once. Which entries the budget drops is decided by
//! `fleet_protocol::history::entries_to_drop`.

use redis::{AsyncCommands, Script};

use fleet_protocol::history::{entries_to_drop, HistoryEntry, HISTORY_TTL_SECS};

use crate::store::{Store, StoreError};

/// Appends a turn's entries once: numbers them from the session's counter (`seq` is spliced in
/// front of each JSON object) and refreshes the TTLs. Keys: history, seq, appended turns.
const APPEND_LUA: &str = r#"
if redis.call('SADD', KEYS[3], ARGV[1]) == 0 then return 0 end
local ttl = tonumber(ARGV[2])
local n = #ARGV - 2
local last = redis.call('INCRBY', KEYS[2], n)
for i = 1, n do
  local seq = last - n + i
  redis.call('RPUSH', KEYS[1], '{"seq":' .. seq .. ',' .. string.sub(ARGV[i + 2], 2))
end
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ttl) end
return n
"#;

/// Drops the oldest `ARGV[2]` entries if the list still starts with `ARGV[1]` (nothing changed it
/// since the caller read it).
const TRIM_LUA: &str = r#"
if redis.call('LINDEX', KEYS[1], 0) ~= ARGV[1] then return 0 end
redis.call('LTRIM', KEYS[1], tonumber(ARGV[2]), -1)
return 1
"#;

impl Store {
    /// Appends a finished turn's exchange to its session's history (once per `append_id`), then
    /// drops the oldest whole exchanges beyond `max_messages` / `max_bytes`.
    pub async fn history_append(
        &self,
        session_id: &str,
        append_id: &str,
        entries: &[HistoryEntry],
        max_messages: usize,
        max_bytes: usize,
    ) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let key = self.keys().session(session_id, "history");
        let script = Script::new(APPEND_LUA);
        let mut inv = script.prepare_invoke();
        inv.key(&key)
            .key(self.keys().session(session_id, "history_seq"))
            .key(self.keys().session(session_id, "history_turns"))
            .arg(append_id)
            .arg(HISTORY_TTL_SECS);
        for e in entries {
            inv.arg(serde_json::to_string(e).expect("an entry serialises"));
        }
        let r: Result<i64, _> = inv.invoke_async(&mut self.conn().await?).await;
        self.count(r)?;
        let raw: Result<Vec<String>, _> = self.conn().await?.lrange(&key, 0, -1).await;
        let raw = self.count(raw)?;
        let sized: Vec<(String, usize)> = raw.iter().map(|s| (exchange_of(s), s.len())).collect();
        let view: Vec<(&str, usize)> = sized.iter().map(|(x, n)| (x.as_str(), *n)).collect();
        let drop = entries_to_drop(&view, max_messages, max_bytes);
        if drop > 0 {
            let r: Result<i64, _> =
                Script::new(TRIM_LUA).key(&key).arg(&raw[0]).arg(drop).invoke_async(&mut self.conn().await?).await;
            self.count(r)?;
        }
        Ok(())
    }

    /// The session's history, oldest first; reading it refreshes its TTL.
    pub async fn history(&self, session_id: &str) -> Result<Vec<HistoryEntry>, StoreError> {
        let key = self.keys().session(session_id, "history");
        let r: Result<(Vec<String>,), _> = redis::pipe()
            .lrange(&key, 0, -1)
            .expire(&key, HISTORY_TTL_SECS as i64)
            .ignore()
            .expire(self.keys().session(session_id, "history_seq"), HISTORY_TTL_SECS as i64)
            .ignore()
            .query_async(&mut self.conn().await?)
            .await;
        // An unreadable entry is skipped, not fatal: it must not stop every later turn of the session.
        Ok(self
            .count(r)?
            .0
            .iter()
            .filter_map(|s| match serde_json::from_str(s) {
                Ok(entry) => Some(entry),
                Err(e) => {
                    tracing::warn!(error = %e, "skipping an unreadable history entry");
                    None
                }
            })
            .collect())
    }

    /// Forgets the session's history. The sequence counter stays (it expires on its own), so a
    /// cursor from before never names a later message.
    pub async fn history_delete(&self, session_id: &str) -> Result<(), StoreError> {
        let r: Result<(), _> = self
            .conn()
            .await?
            .del(&[self.keys().session(session_id, "history"), self.keys().session(session_id, "history_turns")])
            .await;
        self.count(r)
    }
}

/// The exchange (turn) an entry belongs to; an unreadable entry is its own exchange, so it is
/// dropped first and alone.
fn exchange_of(raw: &str) -> String {
    serde_json::from_str::<HistoryEntry>(raw).map(|e| e.exchange).unwrap_or_default()
}
