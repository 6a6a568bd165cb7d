//! Redis key names. One prefix (`fleet:` unless configured) namespaces every key, so the fleet
//! shares a Redis with a tool owner's own `idempotency:` keys, and tests share one safely.
//!
//! Works unchanged on Redis Cluster: keys that one Lua script or pipeline touches share a
//! `{hash tag}`. An execution's keys (its record, attempts, and a turn's state and tool results)
//! take the claim key's whole name as their tag: the claim key keeps the spec's name
//! (`idempotency:{execution_id}`, no braces, so Redis hashes all of it), and one script can claim
//! and write the record together.

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
        [&*self.prefix, "idempotency:", execution_id].concat()
    }

    /// `<prefix><kind>{<prefix>idempotency:<id>}<suffix>`: an execution's key, tagged with its
    /// claim key's whole name. Built in one allocation: a job builds several of these, and nested
    /// `format!`s showed in the worker's profile.
    fn execution_key(&self, kind: &str, execution_id: &str, suffix: &str) -> String {
        let prefix = &*self.prefix;
        [prefix, kind, "{", prefix, "idempotency:", execution_id, "}", suffix].concat()
    }

    /// The execution record (a hash): status, kind, result, timestamps, the step it expects.
    pub fn execution(&self, execution_id: &str) -> String {
        self.execution_key("execution:", execution_id, "")
    }

    /// The execution's attempt history (a list of JSON attempt records).
    pub fn attempts(&self, execution_id: &str) -> String {
        self.execution_key("execution:", execution_id, ":attempts")
    }

    /// An agent turn's state (JSON), in its execution's slot.
    pub fn turn(&self, execution_id: &str) -> String {
        self.execution_key("turn:", execution_id, "")
    }

    /// Hash of a turn's tool-call outcomes by call key (`turn::call_key`).
    pub fn turn_results(&self, execution_id: &str) -> String {
        self.execution_key("turn:", execution_id, ":results")
    }

    /// Where a record was kept before it moved into its claim's slot (read, and moved, by the first
    /// claim after an upgrade; a GET falls back to it).
    pub fn legacy_execution(&self, execution_id: &str) -> String {
        format!("{}execution:{{{execution_id}}}", self.prefix)
    }

    pub fn legacy_attempts(&self, execution_id: &str) -> String {
        format!("{}execution:{{{execution_id}}}:attempts", self.prefix)
    }

    pub fn legacy_turn(&self, execution_id: &str) -> String {
        format!("{}turn:{{{execution_id}}}", self.prefix)
    }

    pub fn legacy_turn_results(&self, execution_id: &str) -> String {
        format!("{}turn:{{{execution_id}}}:results", self.prefix)
    }

    /// Sorted set of job kinds, each scored with when the newest job a worker picked up of that kind
    /// entered its work queue (ms): with the queue's depth, the oldest waiting job's age.
    pub fn pickups(&self) -> String {
        format!("{}pickups", self.prefix)
    }

    /// A session's keys (`lock`, `queue`, `steer`, `events`, `history`, `history_seq`,
    /// `history_turns`, `agent`, `tenant`), sharing one hash tag. The id is percent-encoded in it: a raw `}` would end
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

    /// A registered MCP server (JSON; its headers are encrypted).
    pub fn mcp_server(&self, name: &str) -> String {
        format!("{}{{mcp-servers}}:server:{name}", self.prefix)
    }

    /// Sorted set of registered MCP server names, for listing and the scheduled discovery.
    pub fn mcp_servers_index(&self) -> String {
        format!("{}{{mcp-servers}}:index", self.prefix)
    }

    /// A registered data source (JSON; its connection is encrypted).
    pub fn data_source(&self, id: &str) -> String {
        format!("{}{{data-sources}}:source:{id}", self.prefix)
    }

    /// Sorted set of data source ids, for listing.
    pub fn data_sources_index(&self) -> String {
        format!("{}{{data-sources}}:index", self.prefix)
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

    /// A model provider's fleet-wide budget (a sorted set: each bucket's theoretical arrival
    /// time and the pause a 429 set).
    pub fn llm_budget(&self, provider: &str) -> String {
        format!("{}llm-budget:{{{}}}:pace", self.prefix, hash_tag_safe(provider))
    }

    /// The tokens each waiting step reserved from its provider's budget (a hash, same tag).
    pub fn llm_budget_costs(&self, provider: &str) -> String {
        format!("{}llm-budget:{{{}}}:costs", self.prefix, hash_tag_safe(provider))
    }

    /// The budget's fair line (`fleet_protocol::fair`): a hash of the line's virtual time, each
    /// tenant's finish tag and use, and each waiting step's entry in `llm_budget_waiters`.
    pub fn llm_budget_fair(&self, provider: &str) -> String {
        format!("{}llm-budget:{{{}}}:fair", self.prefix, hash_tag_safe(provider))
    }

    /// Each tenant's waiting steps, in the order they are served: a sorted set ordered by name,
    /// `tenant|order|step` (same tag).
    pub fn llm_budget_waiters(&self, provider: &str) -> String {
        format!("{}llm-budget:{{{}}}:waiters", self.prefix, hash_tag_safe(provider))
    }

    /// Each tenant's places in the budget's line: a sorted set ordered by name,
    /// `tenant|start|seq` (same tag).
    pub fn llm_budget_places(&self, provider: &str) -> String {
        format!("{}llm-budget:{{{}}}:places", self.prefix, hash_tag_safe(provider))
    }

    /// Every tenant's places in the budget's line, by start tag (a sorted set, same tag).
    pub fn llm_budget_line(&self, provider: &str) -> String {
        format!("{}llm-budget:{{{}}}:line", self.prefix, hash_tag_safe(provider))
    }

    /// When each waiting step is given up for gone unless it asks again (a sorted set, same tag).
    pub fn llm_budget_seen(&self, provider: &str) -> String {
        format!("{}llm-budget:{{{}}}:seen", self.prefix, hash_tag_safe(provider))
    }

    /// A tenant's turns running now, fleet-wide (`FLEET_TENANT_MAX_CONCURRENT_TURNS`): a semaphore
    /// like a tool's.
    pub fn tenant_turns(&self, tenant: &str) -> String {
        format!("{}tenant-turns:{{{}}}", self.prefix, hash_tag_safe(tenant))
    }

    /// The turns waiting for one of their tenant's slots, in arrival order (a sorted set), and
    /// when each is given up for gone unless it asks again (a hash); same tag as the semaphore.
    pub fn tenant_turns_line(&self, tenant: &str) -> (String, String) {
        let tag = hash_tag_safe(tenant);
        (format!("{}tenant-turns:{{{tag}}}:line", self.prefix), format!("{}tenant-turns:{{{tag}}}:due", self.prefix))
    }

    /// An assistant (seed 000; JSON). Assistants and their indexes share the `{assistants}` tag.
    pub fn assistant(&self, id: &str) -> String {
        format!("{}{{assistants}}:assistant:{id}", self.prefix)
    }

    /// Sorted set of assistants by `agents::index_member` (creation time, id), for listing.
    pub fn assistants_index(&self) -> String {
        format!("{}{{assistants}}:index", self.prefix)
    }

    /// Hash of assistant name → id: a name names one assistant.
    pub fn assistant_names(&self) -> String {
        format!("{}{{assistants}}:names", self.prefix)
    }

    /// A room (seed 000; JSON). Rooms and their indexes share the `{rooms}` tag.
    pub fn room(&self, id: &str) -> String {
        format!("{}{{rooms}}:room:{id}", self.prefix)
    }

    /// A sorted set of rooms by `agents::index_member`: every room (`RoomIndex::All`), or those of
    /// one namespace or assistant, each also by status. A namespace is percent-encoded in the key
    /// (`%` and `:`), so no namespace's keys are another's.
    pub fn rooms_index(&self, index: &RoomIndex<'_>) -> String {
        let status = |s: Option<&str>| s.map(|s| format!(":status:{s}")).unwrap_or_default();
        match index {
            RoomIndex::All { status: s } => format!("{}{{rooms}}:index:all{}", self.prefix, status(*s)),
            RoomIndex::Namespace { namespace, status: s } => {
                format!("{}{{rooms}}:index:ns:{}{}", self.prefix, colon_safe(namespace), status(*s))
            }
            RoomIndex::Assistant { assistant_id, status: s } => {
                format!("{}{{rooms}}:index:asst:{}{}", self.prefix, colon_safe(assistant_id), status(*s))
            }
        }
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

    /// Hash of each indexed dead letter's facet (`reason` TAB `tool`), so a removal knows which
    /// counters to lower.
    pub fn dead_letters_facets(&self) -> String {
        format!("{}{{dead_letters}}:facets", self.prefix)
    }

    /// Hash of dead-letter counts: `all`, `reason:<r>`, `tool:<t>`, `rt:<r>` TAB `<t>`; kept by the
    /// scripts that add and remove dead letters (see [`dead_letter_count_fields`]).
    pub fn dead_letters_counts(&self) -> String {
        format!("{}{{dead_letters}}:counts", self.prefix)
    }

    /// One sorted set of the executions index (execution ids scored by creation time, ms): the
    /// `all` set, or one per value of a filter dimension (`kind`, `tool`, `room`, `assistant`).
    /// Every set shares the `{executions}` tag, so one script writes an execution's entries.
    pub fn executions_index(&self, dimension: &str, value: &str) -> String {
        if dimension == "all" {
            return format!("{}{{executions}}:all", self.prefix);
        }
        format!("{}{{executions}}:{dimension}:{value}", self.prefix)
    }

    /// One UTC day's token usage (a hash: hourly buckets per tenant, assistant and both, and each
    /// tenant's day total; `tenant::increments`), kept `tenant::USAGE_TTL_SECS`.
    pub fn usage_day(&self, day: i64) -> String {
        format!("{}{{usage:{day}}}", self.prefix)
    }

    /// An approval (a hash: its state, body, decision and the job its decision publishes).
    pub fn approval(&self, id: &str) -> String {
        format!("{}approval:{{{}}}", self.prefix, hash_tag_safe(id))
    }

    /// Approvals by creation time (a sorted set): every tenant's (`None`), or one tenant's.
    pub fn approvals_index(&self, tenant: Option<&str>) -> String {
        match tenant {
            None => format!("{}{{approvals}}:all", self.prefix),
            Some(t) => format!("{}{{approvals}}:tenant:{}", self.prefix, hash_tag_safe(t)),
        }
    }

    /// The operators' audit log (a stream: who changed what, when, how many).
    pub fn audit_log(&self) -> String {
        format!("{}{{audit}}:log", self.prefix)
    }

    /// A console bulk operation's progress (a hash), readable by any dispatcher.
    pub fn console_job(&self, id: &str) -> String {
        format!("{}console-job:{id}", self.prefix)
    }

    /// A tool's circuit history (a list of JSON entries, newest first, bounded): every opening,
    /// half-opening (probes) and closing, in its health hash's slot so the scripts that change
    /// the circuit write it too.
    pub fn tool_circuit_history(&self, name: &str) -> String {
        format!("{}tool-health:{{{}}}:history", self.prefix, hash_tag_safe(name))
    }

    /// The fleet's recent activity (`activity.rs`), all under the `{activity}` tag: one hash per
    /// ten-second bucket (`bucket` is its start in seconds) of jobs finished by kind and outcome.
    pub fn activity_bucket(&self, bucket: i64) -> String {
        format!("{}{{activity}}:finished:{bucket}", self.prefix)
    }

    /// Hash of worker id → the jobs it runs now, by kind (`activity::encode_running`).
    pub fn activity_running(&self) -> String {
        format!("{}{{activity}}:running", self.prefix)
    }

    /// Sorted set of worker ids by their last activity report (ms): a stale report is dropped.
    pub fn activity_workers(&self) -> String {
        format!("{}{{activity}}:workers", self.prefix)
    }

    /// A console login session (a hash: its token's digest, CSRF token), expiring on its own.
    pub fn console_session(&self, id: &str) -> String {
        format!("{}console-session:{id}", self.prefix)
    }

    /// The failed console logins from one source address in the current window (a counter).
    pub fn console_login_failures(&self, source: &str) -> String {
        format!("{}console-login-failures:{source}", self.prefix)
    }
}

/// Which of a room's index sets (`Keys::rooms_index`); `status` is `active` or `closed`, or none
/// for all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoomIndex<'a> {
    All { status: Option<&'a str> },
    Namespace { namespace: &'a str, status: Option<&'a str> },
    Assistant { assistant_id: &'a str, status: Option<&'a str> },
}

/// `s` with `%` and `:` percent-encoded, so it can stand between a key's `:` separators.
fn colon_safe(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains(['%', ':']) {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(s.replace('%', "%25").replace(':', "%3A"))
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

/// A dead letter's facet as the facets hash keeps it: its reason, a tab, its tool (or nothing).
pub fn dead_letter_facet(reason: &str, tool: Option<&str>) -> String {
    format!("{reason}\t{}", tool.unwrap_or_default())
}

/// The field of the dead-letter counts hash that counts a filter by reason and tool: `all`,
/// `reason:<r>`, `tool:<t>` or `rt:<facet>` (the scripts that keep the counts build the same names).
pub fn dead_letter_count_field(reason: Option<&str>, tool: Option<&str>) -> String {
    match (reason, tool) {
        (None, None) => "all".into(),
        (Some(r), None) => format!("reason:{r}"),
        (None, Some(t)) => format!("tool:{t}"),
        (Some(r), Some(t)) => format!("rt:{}", dead_letter_facet(r, Some(t))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_letter_count_fields_name_each_filter() {
        assert_eq!(dead_letter_count_field(None, None), "all");
        assert_eq!(dead_letter_count_field(Some("poison"), None), "reason:poison");
        assert_eq!(dead_letter_count_field(None, Some("t")), "tool:t");
        assert_eq!(dead_letter_count_field(Some("poison"), Some("t")), "rt:poison\tt");
        assert_eq!(dead_letter_facet("exhausted", None), "exhausted\t");
    }

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
            assert_eq!(hashed_part(&k.tool_health(name)), hashed_part(&k.tool_circuit_history(name)), "{name:?}");
        }
        let activity = [k.activity_bucket(17), k.activity_running(), k.activity_workers()];
        assert!(activity.iter().all(|key| hashed_part(key) == "activity"), "{activity:?}");
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
        let k = Keys::new("fleet:");
        assert_eq!(k.idempotency("exec_1"), "fleet:idempotency:exec_1");
        assert_eq!(k.execution("exec_1"), "fleet:execution:{fleet:idempotency:exec_1}");
        assert_eq!(k.attempts("exec_1"), "fleet:execution:{fleet:idempotency:exec_1}:attempts");
        assert_eq!(k.legacy_execution("exec_1"), "fleet:execution:{exec_1}");
    }

    #[test]
    fn an_executions_keys_share_its_claims_slot() {
        for k in [Keys::default(), Keys::new("fleet:"), Keys::new("t9:")] {
            let claim = k.idempotency("exec_1");
            assert!(!claim.contains(['{', '}']), "the claim key is hashed whole: {claim}");
            for key in [k.execution("exec_1"), k.attempts("exec_1"), k.turn("exec_1"), k.turn_results("exec_1")] {
                assert_eq!(hashed_part(&key), claim, "{key}");
            }
        }
    }

    #[test]
    fn registries_of_the_seeds_resources_keep_to_one_slot_each() {
        let k = Keys::new("t1:");
        for key in [k.assistant("asst_1"), k.assistants_index(), k.assistant_names()] {
            assert_eq!(hashed_part(&key), "assistants", "{key}");
        }
        let indexes = [
            RoomIndex::All { status: None },
            RoomIndex::All { status: Some("active") },
            RoomIndex::Namespace { namespace: "user_123", status: Some("closed") },
            RoomIndex::Assistant { assistant_id: "asst_1", status: None },
        ];
        for key in indexes.iter().map(|i| k.rooms_index(i)).chain([k.room("room_1")]) {
            assert_eq!(hashed_part(&key), "rooms", "{key}");
        }
        assert_eq!(k.rooms_index(&indexes[2]), "t1:{rooms}:index:ns:user_123:status:closed");
        // A namespace that looks like a status suffix gets a key of its own.
        let tricky = k.rooms_index(&RoomIndex::Namespace { namespace: "u:status:closed", status: None });
        assert_ne!(tricky, k.rooms_index(&RoomIndex::Namespace { namespace: "u", status: Some("closed") }));
        assert_eq!(tricky, "t1:{rooms}:index:ns:u%3Astatus%3Aclosed");
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
