//! A session's message log: every message of its conversation as it is made (a user's message
//! when it is sent, the assistant's messages when the model answers, tool results when they come),
//! for listing (a room's `GET …/messages`). It is not what the model remembers (the session's
//! history, appended a whole exchange at a time when a turn finishes, and trimmed by budget). Each
//! message is appended once, whatever copies of the step that makes it run.

use crate::store::script::Lua;
use redis::Script;

use fleet_protocol::history::{HistoryEntry, HISTORY_TTL_SECS};

use super::Sessions;
use crate::store::StoreError;

/// The most messages a session's log keeps (the oldest go first).
pub const MAX_LOGGED_MESSAGES: usize = 10_000;

/// KEYS: log, seq, ids. ARGV: message id, ttl, max entries, entry (JSON object). Appends the entry
/// once per id, numbered from the session's counter (`seq` spliced in front); `seq` is 0 when the
/// id was there. A fragment: `session_events` runs it before a turn's last events, in one script.
pub(crate) const LOG_ONCE_LUA: &str = include_str!("lua/log_once.lua");

/// KEYS: log, ids. ARGV: message id. Removes a message whose sending was refused (its turn was
/// certainly not accepted).
const REMOVE_LUA: &str = include_str!("lua/remove.lua");

static APPEND: Lua = Lua::new(|| crate::store::script::load(&[LOG_ONCE_LUA, include_str!("lua/log_once_alone.lua")]));
static REMOVE: Lua = Lua::new(|| crate::store::script::load(&[REMOVE_LUA]));

impl Sessions {
    /// Appends `entry` to the session's message log, once per message id; `false` if it was there.
    pub async fn log_message(&self, session_id: &str, entry: &HistoryEntry) -> Result<bool, StoreError> {
        let r: Result<i64, _> =
            self.log_invocation(&APPEND, session_id, entry).invoke_async(&mut self.redis.conn().await?).await;
        Ok(self.redis.count(r)? > 0)
    }

    /// `script` (`LOG_ONCE_LUA` first) with the log's keys and arguments in front.
    pub(crate) fn log_invocation<'a>(
        &self,
        script: &'a Script,
        session_id: &str,
        entry: &HistoryEntry,
    ) -> redis::ScriptInvocation<'a> {
        let json = serde_json::to_string(entry).expect("a message serialises");
        let mut invocation = script.key(self.redis.keys().session(session_id, "messages"));
        invocation
            .key(self.redis.keys().session(session_id, "messages_seq"))
            .key(self.redis.keys().session(session_id, "messages_ids"))
            .arg(&entry.id)
            .arg(HISTORY_TTL_SECS)
            .arg(MAX_LOGGED_MESSAGES)
            .arg(json);
        invocation
    }

    /// Takes back a message whose turn was certainly not accepted.
    pub async fn unlog_message(&self, session_id: &str, message_id: &str) -> Result<(), StoreError> {
        let r: Result<i64, _> = REMOVE
            .key(self.redis.keys().session(session_id, "messages"))
            .key(self.redis.keys().session(session_id, "messages_ids"))
            .arg(message_id)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r).map(|_| ())
    }

    /// The session's logged messages, oldest first.
    pub async fn logged_messages(&self, session_id: &str) -> Result<Vec<HistoryEntry>, StoreError> {
        let r: Result<Vec<String>, _> = redis::cmd("LRANGE")
            .arg(self.redis.keys().session(session_id, "messages"))
            .arg(0)
            .arg(-1)
            .query_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)?.iter().filter_map(|raw| serde_json::from_str(raw).ok()).collect())
    }

    /// How many messages the log holds, and the newest one (for a room's `message_count` and
    /// `last_message_at`).
    pub async fn log_summary(&self, session_id: &str) -> Result<(u64, Option<HistoryEntry>), StoreError> {
        let key = self.redis.keys().session(session_id, "messages");
        let r: Result<(u64, Option<String>), _> =
            redis::pipe().llen(&key).lindex(&key, -1).query_async(&mut self.redis.conn().await?).await;
        let (count, last) = self.redis.count(r)?;
        Ok((count, last.and_then(|raw| serde_json::from_str(&raw).ok())))
    }
}
