//! Each model provider's configured budget as gauges, set once at start, so the budget's use
//! (`fleet_llm_budget_used_total`) can be read as a fraction of it.

use fleet_platform::config::LlmRouting;
use fleet_platform::metrics::Metrics;

/// Sets `fleet_llm_budget_limit` for every provider's per-minute requests and tokens it is held to.
pub(crate) fn report_limits(metrics: &Metrics, routing: &LlmRouting) {
    for provider in routing.names() {
        let Some(budget) = routing.budget_of(provider) else { continue };
        let limits = [("requests", budget.requests_per_minute.map(u64::from)), ("tokens", budget.tokens_per_minute)];
        for (unit, per_minute) in limits {
            if let Some(n) = per_minute {
                metrics.llm_budget_limit.with_label_values(&[provider, unit]).set(n.min(i64::MAX as u64) as i64);
            }
        }
    }
}
