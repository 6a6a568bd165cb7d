//! A session's artifacts' records in Redis: one hash under the session's hash tag (artifact id →
//! record). An upload writes its records, the note its session's later turns read (a history
//! entry) and its event in one script; the files themselves are in the artifact store
//! (`crate::artifacts`). The records live as long as the history, so the session's bindings
//! (which outlive the history) outlive them too.

use redis::AsyncCommands;
use serde_json::Value;

use fleet_protocol::artifacts::Artifact;
use fleet_protocol::history::{HistoryEntry, HISTORY_TTL_SECS};

use super::Sessions;
use crate::store::script::Lua;
use crate::store::StoreError;

static UPLOAD: Lua = Lua::new(|| {
    crate::store::script::load(&[include_str!("lua/artifact_upload.lua"), super::events::PUBLISH_MANY_LUA])
});

impl Sessions {
    /// Records an upload's `artifacts`, appends `note` to the session's history and `event` to its
    /// stream, all in one script; returns the event's id.
    pub async fn record_upload(
        &self,
        session_id: &str,
        artifacts: &[Artifact],
        note: &HistoryEntry,
        event: &Value,
    ) -> Result<String, StoreError> {
        let keys = self.redis.keys();
        let mut invocation = UPLOAD.prepare_invoke();
        for part in ["artifacts", "history", "history_seq", "history_bytes"] {
            invocation.key(keys.session(session_id, part));
        }
        invocation.arg(HISTORY_TTL_SECS).arg(serde_json::to_string(note).expect("an entry serialises"));
        invocation.arg(artifacts.len());
        for a in artifacts {
            invocation.arg(&a.artifact_id).arg(serde_json::to_string(a).expect("a record serialises"));
        }
        self.publish_to(&mut invocation, session_id, std::slice::from_ref(event));
        let r: Result<Vec<String>, _> = invocation.invoke_async(&mut self.redis.conn().await?).await;
        Ok(self.redis.count(r)?.pop().unwrap_or_default())
    }

    /// The record of the session's artifact `artifact_id`, if it has one.
    pub async fn artifact(&self, session_id: &str, artifact_id: &str) -> Result<Option<Artifact>, StoreError> {
        let key = self.redis.keys().session(session_id, "artifacts");
        let r: Result<Option<String>, _> = self.redis.conn().await?.hget(&key, artifact_id).await;
        Ok(self.redis.count(r)?.and_then(|raw| serde_json::from_str(&raw).ok()))
    }

    /// Every artifact record of the session, oldest first.
    pub async fn artifacts(&self, session_id: &str) -> Result<Vec<Artifact>, StoreError> {
        let key = self.redis.keys().session(session_id, "artifacts");
        let r: Result<Vec<String>, _> = self.redis.conn().await?.hvals(&key).await;
        let mut found: Vec<Artifact> =
            self.redis.count(r)?.iter().filter_map(|raw| serde_json::from_str(raw).ok()).collect();
        found.sort_by(|a, b| (&a.created_at, &a.artifact_id).cmp(&(&b.created_at, &b.artifact_id)));
        Ok(found)
    }

    /// The agent (assistant id) the session is bound to, if an input or upload bound it.
    pub async fn session_agent(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        let r: Result<Option<String>, _> =
            self.redis.conn().await?.get(self.redis.keys().session(session_id, "agent")).await;
        self.redis.count(r)
    }

    /// Forgets the session's artifact records (its files are the artifact store's to delete).
    pub async fn artifacts_delete(&self, session_id: &str) -> Result<(), StoreError> {
        let r: Result<(), _> = self.redis.conn().await?.del(self.redis.keys().session(session_id, "artifacts")).await;
        self.redis.count(r)
    }
}
