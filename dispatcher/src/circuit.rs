//! Tools' circuits as the dispatcher shows them: the `health` object of `GET /v1/tools/{tool}`,
//! and the `fleet_tool_circuit_open{tool}` gauge, refreshed from Redis with the queue gauges so
//! that one process reports it whatever the number of workers.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use fleet_platform::metrics::Metrics;
use fleet_platform::store::{Store, StoreError, ToolHealth};
use fleet_protocol::timefmt::rfc3339_from_millis;

/// The most open circuits the gauge reports (a bound on one refresh's reads).
const GAUGE_LIMIT: usize = 1000;

/// `health` as the API shows it: times in RFC 3339, null where nothing happened yet.
pub fn health_json(health: &ToolHealth) -> Value {
    let time = |ms: Option<i64>| ms.map(rfc3339_from_millis);
    json!({
        "state": if health.open { "open" } else { "closed" },
        "consecutive_failures": health.consecutive_failures,
        "last_success_at": time(health.last_success_ms),
        "last_failure_at": time(health.last_failure_ms),
        "opened_at": time(health.opened_at_ms),
    })
}

/// Sets the gauge to 1 for each tool whose circuit is open and removes the tools of `shown` (the
/// last refresh's) that are not; an index entry whose circuit is closed is dropped from the index.
pub async fn refresh_gauge(store: &Store, metrics: &Metrics, shown: &mut BTreeSet<String>) -> Result<(), StoreError> {
    let mut open = BTreeSet::new();
    for tool in store.open_circuits(GAUGE_LIMIT).await? {
        if store.tool_health(&tool).await?.open {
            open.insert(tool);
        } else {
            store.forget_open_circuit(&tool).await?;
        }
    }
    for gone in shown.difference(&open) {
        let _ = metrics.tool_circuit_open.remove_label_values(&[gone]);
    }
    for tool in &open {
        metrics.tool_circuit_open.with_label_values(&[tool]).set(1);
    }
    *shown = open;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_shows_times_and_nulls() {
        let never = health_json(&ToolHealth::default());
        assert_eq!(
            never,
            json!({"state": "closed", "consecutive_failures": 0, "last_success_at": null, "last_failure_at": null, "opened_at": null})
        );
        let open = ToolHealth { open: true, consecutive_failures: 4, opened_at_ms: Some(0), ..Default::default() };
        let shown = health_json(&open);
        assert_eq!((shown["state"].as_str(), shown["consecutive_failures"].as_u64()), (Some("open"), Some(4)));
        assert_eq!(shown["opened_at"], "1970-01-01T00:00:00.000Z");
    }
}
