//! Endpoint health per tool (the circuit breaker): what an attempt's answer says about the
//! endpoint, a tool's `circuit_breaker` policy and its checks, how long a deferred call waits, and
//! the `tool_unavailable` answer a model gets while a tool's circuit is open.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Consecutive endpoint failures that open a tool's circuit unless the tool or
/// `FLEET_CIRCUIT_FAILURE_THRESHOLD` says otherwise: 0, never, so the seed's behaviour (6 attempts,
/// then the dead letter) stays the default. The README recommends 5 to turn it on: Envoy's outlier
/// detection ejects a host after 5 consecutive 5xx by default, and 5 is below the default
/// schedule's 6 attempts, so a lone call to a dead endpoint waits for its recovery (deferred)
/// instead of being dead-lettered.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 0;
/// How often an open circuit lets one call through as a probe (`FLEET_CIRCUIT_PROBE_INTERVAL`).
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(30);
pub const MAX_FAILURE_THRESHOLD: u32 = 100_000;
pub const MAX_PROBE_INTERVAL_SECS: u64 = 86_400;
/// The shortest wait of a deferred call: a probe key about to expire does not make calls bounce
/// through the broker.
pub const MIN_DEFER: Duration = Duration::from_secs(1);
/// The longest wait of a deferred call, whatever the probe interval: a circuit closed by hand
/// (`fleetctl circuit close`) lets its calls run within this.
pub const MAX_DEFER: Duration = Duration::from_secs(30);
/// The error code a model reads for a call of a tool whose circuit is open.
pub const TOOL_UNAVAILABLE: &str = "tool_unavailable";

/// A tool's `circuit_breaker` field: when its circuit opens and how often it is probed while open;
/// each part optional (the fleet's setting applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(example = json!({"failure_threshold": 3, "probe_interval_seconds": 60})))]
#[serde(deny_unknown_fields)]
pub struct CircuitBreaker {
    /// Consecutive endpoint failures (5xx, 408, 429, timeouts, connection errors) that open the
    /// circuit, 0-100000 (0: never opens); default `FLEET_CIRCUIT_FAILURE_THRESHOLD` (0: never).
    #[cfg_attr(feature = "schema", schema(minimum = 0, maximum = 100000))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<u32>,
    /// Seconds between probes while open (fleet-wide), 1-86400; default
    /// `FLEET_CIRCUIT_PROBE_INTERVAL` (30).
    #[cfg_attr(feature = "schema", schema(minimum = 1, maximum = 86400))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_interval_seconds: Option<u64>,
}

impl CircuitBreaker {
    /// Why the field is refused, if it is.
    pub fn problem(&self) -> Option<String> {
        if self.failure_threshold.is_some_and(|n| n > MAX_FAILURE_THRESHOLD) {
            return Some(format!(
                "circuit_breaker.failure_threshold must be 0-{MAX_FAILURE_THRESHOLD} (0: never opens)"
            ));
        }
        if self.probe_interval_seconds.is_some_and(|s| s == 0 || s > MAX_PROBE_INTERVAL_SECS) {
            return Some(format!("circuit_breaker.probe_interval_seconds must be 1-{MAX_PROBE_INTERVAL_SECS}"));
        }
        None
    }
}

/// The policy in force for one tool: its own field over the fleet's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitPolicy {
    /// 0: the circuit never opens (failures are still counted).
    pub failure_threshold: u32,
    pub probe_interval: Duration,
}

impl Default for CircuitPolicy {
    fn default() -> Self {
        CircuitPolicy { failure_threshold: DEFAULT_FAILURE_THRESHOLD, probe_interval: DEFAULT_PROBE_INTERVAL }
    }
}

impl CircuitPolicy {
    /// `tool`'s own field, where it names a part, over `self` (the fleet's defaults).
    pub fn for_tool(self, tool: Option<&CircuitBreaker>) -> CircuitPolicy {
        let Some(tool) = tool else { return self };
        CircuitPolicy {
            failure_threshold: tool.failure_threshold.unwrap_or(self.failure_threshold),
            probe_interval: tool.probe_interval_seconds.map_or(self.probe_interval, Duration::from_secs),
        }
    }
}

/// What one attempt's answer says about the endpoint (not about the call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// It answered: 2xx, 202, 3xx and 4xx other than 408/429. A 400 or 404 is the caller's
    /// fault (or the call's): the endpoint is up, and its consecutive failures reset.
    Up,
    /// It could not serve: 5xx, 408, 429 (it asks to be given room, which an open circuit gives),
    /// a timeout or a connection failure.
    Down,
    /// Says nothing about the endpoint: the fleet refused the target (SSRF guard), its registry
    /// was unavailable, the tool is gone, or the body was over the fleet's size limit.
    Unknown,
}

/// The endpoint signal of an attempt: its HTTP status, or else its transport failure's metric
/// label (`timeout`, `network`, `too_large`, `refused`, `registry`).
pub fn endpoint_signal(http_status: Option<u16>, failure_label: &str) -> Signal {
    match http_status {
        Some(408 | 429) => Signal::Down,
        Some(500..=599) => Signal::Down,
        Some(100..=499) => Signal::Up,
        Some(_) => Signal::Down,
        None => match failure_label {
            "timeout" | "network" => Signal::Down,
            _ => Signal::Unknown,
        },
    }
}

/// How long a call deferred by an open circuit waits: until the probe slot frees (`probe_ttl`),
/// at least `MIN_DEFER`, at most one probe interval and at most `MAX_DEFER`.
pub fn defer_wait(probe_ttl: Option<Duration>, probe_interval: Duration) -> Duration {
    let ceiling = probe_interval.clamp(MIN_DEFER, MAX_DEFER);
    probe_ttl.unwrap_or(ceiling).clamp(MIN_DEFER, ceiling)
}

/// What a model reads for a call of `tool` while its circuit is open (`opened_at`: RFC 3339).
pub fn unavailable_result(tool: &str, opened_at: Option<&str>, retry_after: Duration) -> Value {
    json!({
        "error": TOOL_UNAVAILABLE,
        "tool": tool,
        "message": format!("the tool {tool:?} is unavailable: its endpoint keeps failing; the call was not sent"),
        "unavailable_since": opened_at,
        "retry_after_seconds": retry_after.as_secs().max(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_throttling_and_silence_are_endpoint_failures() {
        for status in [500, 502, 503, 504, 599, 408, 429] {
            assert_eq!(endpoint_signal(Some(status), "5xx"), Signal::Down, "{status}");
        }
        assert_eq!(endpoint_signal(None, "timeout"), Signal::Down);
        assert_eq!(endpoint_signal(None, "network"), Signal::Down);
    }

    #[test]
    fn an_answer_proves_the_endpoint_up_even_when_the_call_was_wrong() {
        for status in [200, 201, 202, 204, 302, 400, 401, 403, 404, 409, 422] {
            assert_eq!(endpoint_signal(Some(status), "4xx"), Signal::Up, "{status}");
        }
    }

    #[test]
    fn the_fleets_own_refusals_say_nothing_about_the_endpoint() {
        for label in ["refused", "registry", "too_large"] {
            assert_eq!(endpoint_signal(None, label), Signal::Unknown, "{label}");
        }
    }

    #[test]
    fn a_tools_field_overrides_the_defaults_part_by_part() {
        let fleet = CircuitPolicy { failure_threshold: 5, probe_interval: Duration::from_secs(30) };
        assert_eq!(fleet.for_tool(None), fleet);
        let only_threshold = CircuitBreaker { failure_threshold: Some(3), probe_interval_seconds: None };
        assert_eq!(fleet.for_tool(Some(&only_threshold)).failure_threshold, 3);
        assert_eq!(fleet.for_tool(Some(&only_threshold)).probe_interval, Duration::from_secs(30));
        let both = CircuitBreaker { failure_threshold: Some(0), probe_interval_seconds: Some(2) };
        assert_eq!(
            fleet.for_tool(Some(&both)),
            CircuitPolicy { failure_threshold: 0, probe_interval: Duration::from_secs(2) }
        );
    }

    #[test]
    fn the_field_is_checked() {
        let ok: CircuitBreaker =
            serde_json::from_value(json!({"failure_threshold": 5, "probe_interval_seconds": 60})).unwrap();
        assert_eq!(ok.problem(), None);
        assert_eq!(CircuitBreaker::default().problem(), None);
        let zero_interval = CircuitBreaker { probe_interval_seconds: Some(0), ..Default::default() };
        assert!(zero_interval.problem().unwrap().contains("probe_interval_seconds"));
        let huge = CircuitBreaker { failure_threshold: Some(MAX_FAILURE_THRESHOLD + 1), ..Default::default() };
        assert!(huge.problem().unwrap().contains("failure_threshold"));
        assert!(serde_json::from_value::<CircuitBreaker>(json!({"threshold": 5})).is_err(), "unknown fields refused");
        assert!(serde_json::from_value::<CircuitBreaker>(json!({"failure_threshold": -1})).is_err());
    }

    #[test]
    fn a_deferred_call_waits_for_the_probe_slot_within_bounds() {
        let interval = Duration::from_secs(30);
        assert_eq!(defer_wait(Some(Duration::from_secs(12)), interval), Duration::from_secs(12));
        assert_eq!(defer_wait(Some(Duration::from_millis(40)), interval), MIN_DEFER);
        assert_eq!(defer_wait(None, interval), interval);
        assert_eq!(defer_wait(Some(Duration::from_secs(99)), interval), interval);
        assert_eq!(defer_wait(None, Duration::from_millis(10)), MIN_DEFER);
        let hourly = Duration::from_secs(3600);
        assert_eq!(
            defer_wait(Some(Duration::from_secs(3000)), hourly),
            MAX_DEFER,
            "a hand-closed circuit is seen soon"
        );
    }

    #[test]
    fn the_model_reads_a_flat_tool_unavailable_error() {
        let v = unavailable_result("weather", Some("2026-01-01T00:00:00Z"), Duration::from_millis(300));
        assert_eq!(v["error"], TOOL_UNAVAILABLE);
        assert_eq!(v["tool"], "weather");
        assert_eq!(v["retry_after_seconds"], 1);
        assert!(v["message"].as_str().unwrap().contains("not sent"));
    }
}
