//! The fleet's shared contract: everything the dispatcher, the workers and `fleetctl` must agree on.
//!
//! This crate never does I/O. Every decision here ("which queue does attempt 4 go to", "what does
//! a 429 mean for the retry") is a plain function so that it can be unit-tested without a broker.

pub mod activity;
pub mod agent_config;
pub mod agent_session;
pub mod agents;
pub mod approval_policy;
pub mod approvals;
pub mod artifacts;
pub mod budget;
pub mod callback;
pub mod chat;
pub mod circuit;
pub mod classify;
pub mod compaction;
pub mod data_sources;
pub mod dead_letters;
pub mod envelope;
pub mod events;
pub mod execution;
pub mod external_result;
pub mod fair;
pub mod history;
pub mod idempotency;
pub mod ids;
pub mod keys;
pub mod life;
pub mod limits;
pub mod mcp;
pub mod output_sink;
pub mod redact;
pub mod retry;
pub mod retry_spec;
pub mod sanitize;
pub mod schedule;
pub mod schema;
pub mod secrets;
pub mod signature_scheme;
pub mod signing;
pub mod ssrf;
pub mod standard_webhooks;
pub mod stream_token;
pub mod surfaces;
pub mod tenant;
pub mod timefmt;
pub mod tools;
pub mod topology;
pub mod turn;

/// Seven days: how long idempotency claims, results and `Idempotency-Key` mappings live.
pub const IDEMPOTENCY_TTL_SECS: u64 = 7 * 24 * 60 * 60;

/// An execution id derived from `parts`: the same parts always give the same id, so a job that
/// may be emitted twice (a failure event re-sent after a crash) is still delivered once.
pub fn derived_execution_id(parts: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for p in parts {
        hasher.update(p.as_bytes());
        hasher.update([0u8]);
    }
    format!("exec_{}", &hex::encode(hasher.finalize())[..32])
}

/// The execution id of call `index` of a batch accepted as `batch_id`: a retry of the batch with
/// the same `Idempotency-Key` finds the same ids without storing them.
pub fn batch_item_id(batch_id: &str, index: usize) -> String {
    format!("{batch_id}_{index}")
}

/// Generates a new execution id in the seed's `exec_…` form (time-ordered, so ids sort by creation).
pub fn new_execution_id() -> String {
    format!("exec_{}", uuid::Uuid::now_v7().simple())
}

#[cfg(test)]
mod tests {
    #[test]
    fn batch_item_ids_are_valid_and_distinct() {
        let batch = super::new_execution_id();
        let ids: std::collections::HashSet<String> = (0..1000).map(|i| super::batch_item_id(&batch, i)).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids.iter().all(|id| crate::envelope::is_valid_execution_id(id)));
    }

    #[test]
    fn derived_ids_are_stable_valid_and_distinct() {
        let a = super::derived_execution_id(&["exec_1", "tool.callback.failed", "hook"]);
        assert_eq!(a, super::derived_execution_id(&["exec_1", "tool.callback.failed", "hook"]));
        assert_ne!(a, super::derived_execution_id(&["exec_1", "tool.callback.dead_letter", "hook"]));
        assert!(crate::envelope::is_valid_execution_id(&a));
        assert!(crate::envelope::is_valid_execution_id(&super::new_execution_id()));
    }
}
