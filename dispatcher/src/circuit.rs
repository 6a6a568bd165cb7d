//! Tools' circuits as the dispatcher shows them: the `health` object of `GET /v1/tools/{tool}`
//! (with the circuit's history),
//! and the `fleet_tool_circuit_open{tool}` gauge, refreshed from Redis with the queue gauges so
//! that one process reports it whatever the number of workers.

use std::collections::BTreeSet;

use serde::Serialize;
use utoipa::ToSchema;

use fleet_platform::metrics::Metrics;
use fleet_platform::store::{CircuitEvent, Store, StoreError, ToolHealth};
use fleet_protocol::timefmt::rfc3339_from_millis;

/// The most open circuits the gauge reports (a bound on one refresh's reads).
const GAUGE_LIMIT: usize = 1000;

/// A tool's endpoint health (`GET /v1/tools/{tool}` only).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ToolHealth)]
pub(crate) struct ToolHealthOut {
    /// `open`: calls are deferred and turns get `tool_unavailable`.
    #[schema(example = "closed")]
    pub state: &'static str,
    pub consecutive_failures: u64,
    /// RFC 3339; null if never.
    pub last_success_at: Option<String>,
    pub last_failure_at: Option<String>,
    /// When the circuit opened; null while closed.
    pub opened_at: Option<String>,
    /// The circuit's latest changes, newest first (at most 20 here; 50 are kept).
    pub history: Vec<CircuitEventOut>,
}

/// One change of a tool's circuit.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = CircuitEvent)]
pub(crate) struct CircuitEventOut {
    /// RFC 3339.
    pub at: String,
    /// `open`, `half_open` (a probe call let through) or `closed`.
    #[schema(example = "open")]
    pub state: String,
    /// Why: the failures that opened it and the last one's error, a probe, a call that succeeded,
    /// or an operator.
    pub why: String,
    /// Who closed it by hand (the audit log's actor); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// A half-opening: the latest probe call, how many probes in a row, and when the latest went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_probe_at: Option<String>,
}

impl From<&CircuitEvent> for CircuitEventOut {
    fn from(e: &CircuitEvent) -> Self {
        let probe = e.execution_id.is_some();
        Self {
            at: rfc3339_from_millis(e.at_ms),
            state: e.state.clone(),
            why: e.why.clone(),
            by: e.by.clone(),
            execution_id: e.execution_id.clone(),
            probes: probe.then(|| e.probes.unwrap_or(1)),
            last_probe_at: if probe { e.last_probe_ms.map(rfc3339_from_millis) } else { None },
        }
    }
}

impl ToolHealthOut {
    /// The health as a tenant-bound caller sees it: every tenant's calls move one circuit, so its
    /// history keeps when and what changed but no call's error text, prober or execution id.
    pub(crate) fn for_tenants(mut self) -> Self {
        for event in &mut self.history {
            event.why = match (event.state.as_str(), event.by.is_some()) {
                (_, true) => "changed by an operator",
                ("open", _) => "the endpoint failed too many times in a row",
                ("half_open", _) => "a probe call was let through",
                _ => "the endpoint answered again",
            }
            .to_string();
            event.by = None;
            event.execution_id = None;
        }
        self
    }

    /// The health with the circuit's `history` (newest first).
    pub(crate) fn new(health: &ToolHealth, history: &[CircuitEvent]) -> Self {
        Self { history: history.iter().map(CircuitEventOut::from).collect(), ..Self::from(health) }
    }
}

impl From<&ToolHealth> for ToolHealthOut {
    /// Times in RFC 3339, null where nothing happened yet.
    fn from(health: &ToolHealth) -> Self {
        let time = |ms: Option<i64>| ms.map(rfc3339_from_millis);
        Self {
            state: if health.open { "open" } else { "closed" },
            consecutive_failures: health.consecutive_failures,
            last_success_at: time(health.last_success_ms),
            last_failure_at: time(health.last_failure_ms),
            opened_at: time(health.opened_at_ms),
            history: vec![],
        }
    }
}

/// Sets the gauge to 1 for each tool whose circuit is open and removes the tools of `shown` (the
/// last refresh's) that are not; an index entry whose circuit is closed is dropped from the index.
pub async fn refresh_gauge(store: &Store, metrics: &Metrics, shown: &mut BTreeSet<String>) -> Result<(), StoreError> {
    let mut open = BTreeSet::new();
    for tool in store.limits().open_circuits(GAUGE_LIMIT).await? {
        if store.limits().tool_health(&tool).await?.open {
            open.insert(tool);
        } else {
            store.limits().forget_open_circuit(&tool).await?;
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
    use serde_json::json;

    fn health_json(health: &ToolHealth) -> serde_json::Value {
        serde_json::to_value(ToolHealthOut::from(health)).unwrap()
    }

    #[test]
    fn health_shows_times_and_nulls() {
        let never = health_json(&ToolHealth::default());
        assert_eq!(
            never,
            json!({"state": "closed", "consecutive_failures": 0, "last_success_at": null, "last_failure_at": null, "opened_at": null, "history": []})
        );
        let open = ToolHealth { open: true, consecutive_failures: 4, opened_at_ms: Some(0), ..Default::default() };
        let shown = health_json(&open);
        assert_eq!((shown["state"].as_str(), shown["consecutive_failures"].as_u64()), (Some("open"), Some(4)));
        assert_eq!(shown["opened_at"], "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn history_shows_who_closed_it_and_the_probes_of_a_half_opening() {
        let event = |state: &str, by: Option<&str>, probe: Option<&str>| CircuitEvent {
            at_ms: 0,
            state: state.into(),
            why: "w".into(),
            by: by.map(Into::into),
            execution_id: probe.map(Into::into),
            probes: probe.map(|_| 3),
            last_probe_ms: probe.map(|_| 1_000),
        };
        let health = ToolHealthOut::new(
            &ToolHealth::default(),
            &[event("closed", Some("token:abc"), None), event("half_open", None, Some("exec_1"))],
        );
        let shown = serde_json::to_value(health).unwrap()["history"].clone();
        assert_eq!(
            shown[0],
            json!({"at": "1970-01-01T00:00:00.000Z", "state": "closed", "why": "w", "by": "token:abc"})
        );
        assert_eq!((shown[1]["probes"].as_u64(), shown[1]["execution_id"].as_str()), (Some(3), Some("exec_1")));
        assert_eq!(shown[1]["last_probe_at"], "1970-01-01T00:00:01.000Z");
    }
}
