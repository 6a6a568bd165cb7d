//! The fleet's shared contract: everything the dispatcher, the workers and `fleetctl` must agree on.
//!
//! This crate never does I/O. Every decision here ("which queue does attempt 4 go to", "what does
//! a 429 mean for the retry") is a plain function so that it can be unit-tested without a broker.

pub mod callback;
pub mod classify;
pub mod deadletter;
pub mod envelope;
pub mod execution;
pub mod keys;
pub mod retry;
pub mod secrets;
pub mod signing;
pub mod ssrf;
pub mod timefmt;
pub mod topology;
pub mod tracecontext;

/// Seven days: how long idempotency claims, results and `Idempotency-Key` mappings live.
pub const IDEMPOTENCY_TTL_SECS: u64 = 7 * 24 * 60 * 60;

/// Generates a new execution id in the seed's `exec_…` form (time-ordered, so ids sort by creation).
pub fn new_execution_id() -> String {
    format!("exec_{}", uuid::Uuid::now_v7().simple())
}
