//! Redis key names. One optional prefix (empty in production) lets tests share a Redis safely.
//!
//! Works unchanged on Redis Cluster: keys that one Lua script or pipeline touches share a
//! `{hash tag}` (an execution's record and its attempts; a session's keys; a registry and its
//! index). The claim key (`idempotency:…`, the spec's name) shares no slot with the record, so the
//! record carries its own fence (`field::FENCE`).

/// Cloned with every store handle (into each request's state), hence a shared string.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Keys {
    prefix: std::sync::Arc<str>,
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Self {
        Keys { prefix: prefix.into().into() }
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

    /// The newest step fence that wrote a turn's state (`turn::step_fence`).
    pub fn turn_fence(&self, execution_id: &str) -> String {
        format!("{}turn:{{{execution_id}}}:fence", self.prefix)
    }

    /// Hash of a turn's tool-call outcomes by call id.
    pub fn turn_results(&self, execution_id: &str) -> String {
        format!("{}turn:{{{execution_id}}}:results", self.prefix)
    }

    /// A session's keys (`lock`, `queue`, `steer`, `events`, `history`, `history_seq`,
    /// `history_turns`), sharing one hash tag. The id is percent-encoded in it: a raw `}` would end
    /// the tag early (or empty it, hashing each whole key apart), and encoding `%` too keeps two ids
    /// from ever sharing a tag.
    pub fn session(&self, session_id: &str, part: &str) -> String {
        format!("{}session:{{{}}}:{part}", self.prefix, hash_tag_safe(session_id))
    }

    /// The Pub/Sub channel on which every appended session event is announced (the message is the
    /// session id), so a dispatcher reads a session's stream only when it has something new.
    pub fn session_events_channel(&self) -> String {
        format!("{}session-events", self.prefix)
    }

    /// A registered tool (a hash; the secret field is encrypted).
    pub fn tool(&self, name: &str) -> String {
        format!("{}{{tools}}:tool:{name}", self.prefix)
    }

    /// Sorted set of registered tool names, for listing.
    pub fn tools_index(&self) -> String {
        format!("{}{{tools}}:index", self.prefix)
    }

    /// Hash of tool id → tool name, so the id the API hands out addresses the tool.
    pub fn tool_ids(&self) -> String {
        format!("{}{{tools}}:ids", self.prefix)
    }

    /// A tool's endpoint health (a hash: consecutive failures, last success and failure, circuit
    /// state); its probe slot shares the tag, so one script takes both.
    pub fn tool_health(&self, name: &str) -> String {
        format!("{}tool-health:{{{}}}", self.prefix, hash_tag_safe(name))
    }

    /// Held (`SET NX PX`) by the one probe an open circuit lets through per probe interval.
    pub fn tool_probe(&self, name: &str) -> String {
        format!("{}tool-health:{{{}}}:probe", self.prefix, hash_tag_safe(name))
    }

    /// Sorted set of tools whose circuit is open, by opening time: kept beside the health hashes
    /// (another slot, so written after them) for the open-circuit gauge, which checks each entry.
    pub fn open_circuits(&self) -> String {
        format!("{}{{tool-health}}:open", self.prefix)
    }

    /// A registered webhook (JSON; the secret field is encrypted).
    pub fn webhook(&self, id: &str) -> String {
        format!("{}{{webhooks}}:webhook:{id}", self.prefix)
    }

    /// Sorted set of webhook ids, for listing and fan-out.
    pub fn webhooks_index(&self) -> String {
        format!("{}{{webhooks}}:index", self.prefix)
    }

    /// A tool's concurrency semaphore (a sorted set of holder → lease expiry in ms), fleet-wide.
    pub fn tool_concurrency(&self, tool_name: &str) -> String {
        format!("{}tool-limits:{{{}}}:concurrency", self.prefix, hash_tag_safe(tool_name))
    }

    /// A tool's rate limiter (GCRA): a sorted set of the theoretical arrival time and the slots
    /// reserved by calls waiting in the broker.
    pub fn tool_rate(&self, tool_name: &str) -> String {
        format!("{}tool-limits:{{{}}}:rate", self.prefix, hash_tag_safe(tool_name))
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

/// `id` with `%`, `{` and `}` percent-encoded: brace-free, so it is a whole hash tag, and distinct
/// ids stay distinct. Ids without those characters are unchanged (their keys too).
fn hash_tag_safe(id: &str) -> std::borrow::Cow<'_, str> {
    if !id.contains(['%', '{', '}']) {
        return std::borrow::Cow::Borrowed(id);
    }
    let mut out = String::with_capacity(id.len() + 8);
    for c in id.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The part of a key Redis Cluster hashes: the first `{…}` if non-empty, else the whole key.
    fn hashed_part(key: &str) -> &str {
        if let Some(open) = key.find('{') {
            if let Some(len) = key[open + 1..].find('}') {
                if len > 0 {
                    return &key[open + 1..open + 1 + len];
                }
            }
        }
        key
    }

    #[test]
    fn a_sessions_keys_share_one_slot_whatever_its_id() {
        let k = Keys::new("t1:");
        for id in ["plain", "}odd{", "{a}b", "{}", "}", "a{b}c", "%7B", "100%"] {
            let tags: Vec<String> = ["lock", "queue", "steer", "events"]
                .iter()
                .map(|p| hashed_part(&k.session(id, p)).to_string())
                .collect();
            assert!(tags.iter().all(|t| t == &tags[0] && !t.contains(['{', '}'])), "{id:?}: {tags:?}");
        }
        assert_eq!(k.session("s1", "lock"), "t1:session:{s1}:lock", "plain ids keep their keys");
        assert_eq!(k.session("}odd{", "queue"), "t1:session:{%7Dodd%7B}:queue");
    }

    #[test]
    fn a_tools_health_and_probe_share_one_slot_apart_from_other_tools() {
        let k = Keys::new("t1:");
        for name in ["weather", "a-b_c", "{odd}"] {
            assert_eq!(hashed_part(&k.tool_health(name)), hashed_part(&k.tool_probe(name)), "{name:?}");
        }
        assert_eq!(k.tool_health("weather"), "t1:tool-health:{weather}");
        assert_ne!(hashed_part(&k.tool_health("a")), hashed_part(&k.tool_health("b")));
    }

    #[test]
    fn distinct_session_ids_never_share_a_tag() {
        let k = Keys::default();
        let ids = ["{odd}", "%7Bodd%7D", "%257Bodd%257D", "odd", "%", "%25"];
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                assert_ne!(hashed_part(&k.session(a, "lock")), hashed_part(&k.session(b, "lock")), "{a:?} vs {b:?}");
            }
        }
    }

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
        assert_eq!(k.tool_concurrency("search"), "t42:tool-limits:{search}:concurrency");
        assert_eq!(k.tool_rate("search"), "t42:tool-limits:{search}:rate");
    }
}
