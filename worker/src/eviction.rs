//! Whether Redis may evict the keys that make a job run once: an evicted claim lets a job run
//! twice, so a worker says so at start when Redis's eviction policy allows it.

use fleet_platform::store::Store;

/// Warns unless Redis never evicts idempotency keys (`noeviction`, or no policy reported).
pub(crate) async fn warn_if_keys_may_be_evicted(store: &Store) {
    match store.redis().maxmemory_policy().await {
        Ok(policy) if policy != "noeviction" && !policy.is_empty() && !policy.starts_with("volatile-") => {
            tracing::warn!(
                maxmemory_policy = %policy,
                "Redis may evict idempotency keys under memory pressure (a job could then run twice); set maxmemory-policy noeviction"
            );
        }
        Ok(policy) if policy.starts_with("volatile-") => {
            tracing::warn!(
                maxmemory_policy = %policy,
                "Redis evicts keys that have a TTL, and idempotency keys do; set maxmemory-policy noeviction"
            );
        }
        _ => {}
    }
}
