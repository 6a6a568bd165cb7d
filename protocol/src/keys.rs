//! Redis key names. One optional prefix (empty in production) lets tests share a Redis safely.
//!
//! Works unchanged on Redis Cluster: keys that one Lua script or pipeline touches share a
//! `{hash tag}` (an execution's record and its attempts; a session's keys; a registry and its
//! index). The claim key (`idempotency:…`, the spec's name) shares no slot with the record, so the
//! record carries its own fence (`field::FENCE`).

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Self {
        Keys { prefix: prefix.into() }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `idempotency:{execution_id}`: the worker's claim (a lease with a fencing token), then the result.
    pub fn idempotency(&self, execution_id: &str) -> String {
        format!("{}idempotency:{execution_id}", self.prefix)
    }

    /// The execution record (a hash): status, kind, result, timestamps.
    pub fn execution(&self, execution_id: &str) -> String {
        format!("{}execution:{{{execution_id}}}", self.prefix)
    }

    /// The execution's attempt history (a list of JSON attempt records).
    pub fn attempts(&self, execution_id: &str) -> String {
        format!("{}execution:{{{execution_id}}}:attempts", self.prefix)
    }

    /// Sorted set of executions of `kind` accepted but not yet started, by acceptance time (ms).
    pub fn waiting(&self, kind: &str) -> String {
        format!("{}waiting:{kind}", self.prefix)
    }

    /// An agent turn's state (JSON); its tool results share the hash tag.
    pub fn turn(&self, execution_id: &str) -> String {
        format!("{}turn:{{{execution_id}}}", self.prefix)
    }

    /// Hash of a turn's tool-call outcomes by call id.
    pub fn turn_results(&self, execution_id: &str) -> String {
        format!("{}turn:{{{execution_id}}}:results", self.prefix)
    }

    /// A session's keys (`lock`, `queue`, `steer`, `events`, `history`, `history_seq`,
    /// `history_turns`), sharing one hash tag.
    pub fn session(&self, session_id: &str, part: &str) -> String {
        format!("{}session:{{{session_id}}}:{part}", self.prefix)
    }

    /// A registered tool (a hash; the secret field is encrypted).
    pub fn tool(&self, name: &str) -> String {
        format!("{}{{tools}}:tool:{name}", self.prefix)
    }

    /// Sorted set of registered tool names, for listing.
    pub fn tools_index(&self) -> String {
        format!("{}{{tools}}:index", self.prefix)
    }

    /// A registered webhook (JSON; the secret field is encrypted).
    pub fn webhook(&self, id: &str) -> String {
        format!("{}{{webhooks}}:webhook:{id}", self.prefix)
    }

    /// Sorted set of webhook ids, for listing and fan-out.
    pub fn webhooks_index(&self) -> String {
        format!("{}{{webhooks}}:index", self.prefix)
    }

    /// A client's `Idempotency-Key`, namespaced by a digest of its bearer token.
    pub fn request_key(&self, token_digest: &str, idempotency_key_digest: &str) -> String {
        format!("{}request:{token_digest}:{idempotency_key_digest}", self.prefix)
    }

    /// The dead-letter record of an execution (JSON string).
    pub fn dead_letter(&self, execution_id: &str) -> String {
        format!("{}{{dead_letters}}:record:{execution_id}", self.prefix)
    }

    /// Held while one operation (retry, delete) acts on a dead letter, so two never act on it at once.
    pub fn dead_letter_lock(&self, execution_id: &str) -> String {
        format!("{}{{dead_letters}}:lock:{execution_id}", self.prefix)
    }

    /// Sorted set of dead-lettered execution ids by time.
    pub fn dead_letters_index(&self) -> String {
        format!("{}{{dead_letters}}:index", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn production_keys_match_the_spec() {
        let k = Keys::default();
        assert_eq!(k.idempotency("exec_1"), "idempotency:exec_1");
        assert_eq!(k.execution("exec_1"), "execution:{exec_1}");
        assert_eq!(k.attempts("exec_1"), "execution:{exec_1}:attempts");
    }

    #[test]
    fn a_prefix_isolates_a_test() {
        let k = Keys::new("t42:");
        assert_eq!(k.idempotency("exec_1"), "t42:idempotency:exec_1");
        assert_eq!(k.tool("search"), "t42:{tools}:tool:search");
        assert_eq!(k.tools_index(), "t42:{tools}:index");
    }
}
