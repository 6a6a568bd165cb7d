//! Prometheus metrics (tikv's `prometheus` crate, text exposition). Every name starts with `fleet_`,
//! carries its unit, and every label has a bounded set of values: never an id or a URL.

use std::sync::Arc;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Buckets from 1 ms to 2 min: callbacks are fast, but retries stretch end-to-end latency to 31 s+.
const LATENCY_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];

/// All of the fleet's metrics, shared: a clone (every request's state makes several) is one
/// reference count, not one per metric.
#[derive(Clone)]
pub struct Metrics(Arc<MetricSet>);

impl std::ops::Deref for Metrics {
    type Target = MetricSet;
    fn deref(&self) -> &MetricSet {
        &self.0
    }
}

/// The metrics themselves; each process updates the ones that concern it.
pub struct MetricSet {
    pub registry: Registry,
    pub jobs_published: IntCounterVec,
    pub jobs_started: IntCounterVec,
    pub jobs_finished: IntCounterVec,
    pub attempt_duration: HistogramVec,
    pub job_latency: HistogramVec,
    pub callback_responses: IntCounterVec,
    pub jobs_in_flight: IntGaugeVec,
    pub queue_messages: IntGaugeVec,
    pub queue_consumers: IntGaugeVec,
    pub idempotency_hits: IntCounterVec,
    /// Copies of jobs a worker only acked (an earlier step, an ended execution, finished work) or
    /// that carried out what an earlier delivery owed.
    pub duplicate_deliveries: IntCounterVec,
    /// Publishes a job owed (its retry, poll, park, a turn's calls) that the broker refused while
    /// the delivery was held, each tried again.
    pub outcome_publish_retries: IntCounterVec,
    pub retries_scheduled: IntCounterVec,
    pub dead_letters: IntCounterVec,
    pub amqp_reconnects: IntCounter,
    pub amqp_errors: IntCounter,
    pub redis_errors: IntCounter,
    pub broker_connected: IntGauge,
    pub http_requests: IntCounterVec,
    pub http_request_duration: HistogramVec,
    pub oldest_job_age: prometheus::GaugeVec,
    /// Dead letters held in Redis (the dispatcher reports it with the queue gauges).
    pub dead_letters_stored: IntGauge,
    pub llm_request_duration: HistogramVec,
    pub llm_tokens: IntCounterVec,
    pub llm_tenant_tokens: IntCounterVec,
    /// Tool calls deferred in the broker by the tool's limits (`reason`: `concurrency`,
    /// `rate_limit`, or `unavailable` when Redis could not decide: fail closed).
    pub tool_deferred: IntCounterVec,
    /// 1 per tool whose circuit is open (the dispatcher reports it from Redis, so several
    /// workers never disagree); the label is a registered tool's name.
    pub tool_circuit_open: IntGaugeVec,
    /// Circuits this worker opened or closed (`opened`, `closed`), and calls it deferred or let
    /// through as probes (`deferred`, `probe`).
    pub circuit_events: IntCounterVec,
    /// What model calls spent of their provider's budget (`unit`: `requests` sent, `tokens`
    /// used); the `provider` label is a configured provider's name.
    pub llm_budget_used: IntCounterVec,
    /// A provider's configured budget per minute (`unit`: `requests`, `tokens`), so a dashboard
    /// shows the use as a fraction of it.
    pub llm_budget_limit: IntGaugeVec,
    /// Turn steps parked before their model call (`reason`: `budget`, `paused` by a 429,
    /// `unavailable` when Redis could not decide).
    pub llm_budget_parked: IntCounterVec,
    /// How far ahead a parked step's slot was: the wait on the provider's budget.
    pub llm_budget_wait: HistogramVec,
    /// 429 answers from a provider (each pauses it fleet-wide).
    pub llm_rate_limited: IntCounterVec,
    /// Turn steps parked because their tenant's turns were all running
    /// (`FLEET_TENANT_MAX_CONCURRENT_TURNS`; `tenant` is one of the configured tenants, so the
    /// label is bounded; `reason`: `concurrency`, `unavailable`).
    pub tenant_turns_parked: IntCounterVec,
    /// Submissions of a tenant flooding the fleet that waited in the dispatcher for one of its
    /// places (`FLEET_FLOODING_TENANT_SUBMISSIONS`).
    pub submissions_held: IntCounterVec,
}

impl Metrics {
    /// `fleet_jobs_finished_total` as it stands, by kind and outcome.
    pub fn finished_counts(&self) -> std::collections::BTreeMap<(String, String), u64> {
        use prometheus::core::Collector;
        let mut out = std::collections::BTreeMap::new();
        for family in self.jobs_finished.collect() {
            for m in family.get_metric() {
                let label = |name: &str| m.get_label().iter().find(|l| l.name() == name).map(|l| l.value().to_string());
                if let (Some(kind), Some(outcome)) = (label("kind"), label("outcome")) {
                    out.insert((kind, outcome), m.get_counter().get_value() as u64);
                }
            }
        }
        out
    }

    /// Registers every metric; `process` is `dispatcher`, `worker` or `fleetctl`.
    pub fn new(process: &str) -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry.register(Box::new(g.clone())).expect("unique metric");
            g
        };
        let histogram = |name: &str, help: &str, labels: &[&str]| {
            let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()), labels)
                .expect("valid metric");
            registry.register(Box::new(h.clone())).expect("unique metric");
            h
        };
        let single_counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            registry.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let build_info =
            gauge("fleet_build_info", "Build metadata of this process (always 1).", &["version", "process"]);
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION"), process]).set(1);
        let broker_connected =
            IntGauge::new("fleet_broker_connected", "1 while the process holds a live broker connection.")
                .expect("valid metric");
        registry.register(Box::new(broker_connected.clone())).expect("unique metric");
        let dead_letters_stored =
            IntGauge::new("fleet_dead_letters_stored", "Dead letters held in Redis, the store of record.")
                .expect("valid metric");
        registry.register(Box::new(dead_letters_stored.clone())).expect("unique metric");
        Metrics(Arc::new(MetricSet {
            dead_letters_stored,
            jobs_published: counter(
                "fleet_jobs_published_total",
                "Jobs published and confirmed by the broker.",
                &["kind"],
            ),
            jobs_started: counter("fleet_jobs_started_total", "Job attempts started by workers.", &["kind"]),
            jobs_finished: counter(
                "fleet_jobs_finished_total",
                "Job attempts finished, by outcome (success, retry, dead_letter, duplicate, permanent, deferred, cancelled, ...).",
                &["kind", "outcome"],
            ),
            attempt_duration: histogram("fleet_attempt_duration_seconds", "Duration of one job attempt.", &["kind"]),
            job_latency: histogram(
                "fleet_job_latency_seconds",
                "From acceptance by the dispatcher to the job's final outcome.",
                &["kind", "outcome"],
            ),
            callback_responses: counter(
                "fleet_callback_responses_total",
                "Answers from tool owners: status class, or timeout/network/too_large/refused.",
                &["kind", "class"],
            ),
            jobs_in_flight: gauge("fleet_jobs_in_flight", "Jobs a worker holds right now.", &["kind"]),
            queue_messages: gauge("fleet_queue_messages", "Messages ready in each fleet queue.", &["queue"]),
            queue_consumers: gauge("fleet_queue_consumers", "Consumers on each fleet queue.", &["queue"]),
            duplicate_deliveries: counter(
                "fleet_duplicate_deliveries_total",
                "Copies of jobs that were only acked (an earlier step, an ended or finished execution) or carried out what an earlier delivery owed.",
                &["kind"],
            ),
            outcome_publish_retries: counter(
                "fleet_outcome_publish_retries_total",
                "Publishes a job owed (retry, poll, park, a turn's calls) refused by the broker and tried again while the delivery was held.",
                &["kind"],
            ),
            idempotency_hits: counter(
                "fleet_idempotency_hits_total",
                "Deliveries whose execution had already succeeded, so nothing ran again.",
                &["kind"],
            ),
            retries_scheduled: counter(
                "fleet_retries_scheduled_total",
                "Retries parked on a delay queue, by the attempt they will be.",
                &["kind", "attempt"],
            ),
            dead_letters: counter(
                "fleet_dead_letters_total",
                "Jobs dead-lettered (by a worker, or found on the dead-letter queue by the dispatcher's drain).",
                &["kind", "reason"],
            ),
            amqp_reconnects: single_counter("fleet_amqp_reconnects_total", "Broker connections (re)established."),
            amqp_errors: single_counter("fleet_amqp_errors_total", "Broker connection or channel errors."),
            redis_errors: single_counter("fleet_redis_errors_total", "Failed Redis commands."),
            broker_connected,
            http_requests: counter(
                "fleet_http_requests_total",
                "API requests by route template, method and status class.",
                &["route", "method", "class"],
            ),
            http_request_duration: histogram(
                "fleet_http_request_duration_seconds",
                "API request duration.",
                &["route"],
            ),
            oldest_job_age: {
                let g = prometheus::GaugeVec::new(
                    Opts::new("fleet_oldest_job_age_seconds", "Age of the oldest job accepted but not yet started."),
                    &["kind"],
                )
                .expect("valid metric");
                registry.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            llm_request_duration: histogram(
                "fleet_llm_request_duration_seconds",
                "LLM chat-completion request duration.",
                &["model"],
            ),
            llm_tokens: counter(
                "fleet_llm_tokens_total",
                "LLM tokens used, by model and type (prompt, completion).",
                &["model", "type"],
            ),
            llm_tenant_tokens: counter(
                "fleet_llm_tenant_tokens_total",
                "LLM tokens used, by tenant (a tenant the configuration names, else other) and type.",
                &["tenant", "type"],
            ),
            tool_deferred: counter(
                "fleet_tool_deferred_total",
                "Tool calls deferred in the broker by the tool's max_concurrency or rate_limit (no attempt spent).",
                &["tool", "reason"],
            ),
            tool_circuit_open: gauge(
                "fleet_tool_circuit_open",
                "1 while the tool's circuit is open (its endpoint kept failing; calls are deferred).",
                &["tool"],
            ),
            circuit_events: counter(
                "fleet_tool_circuit_events_total",
                "Circuit events: opened, closed, deferred (a call held back), probe (a call let through).",
                &["event"],
            ),
            llm_budget_used: counter(
                "fleet_llm_budget_used_total",
                "What model calls spent of their provider's budget: requests sent, tokens used.",
                &["provider", "unit"],
            ),
            llm_budget_limit: gauge(
                "fleet_llm_budget_limit",
                "A provider's configured budget per minute (requests, tokens).",
                &["provider", "unit"],
            ),
            llm_budget_parked: counter(
                "fleet_llm_budget_parked_total",
                "Turn steps parked before their model call: over the provider's budget, paused by its 429, or Redis unavailable.",
                &["provider", "reason"],
            ),
            llm_budget_wait: {
                let h = HistogramVec::new(
                    HistogramOpts::new(
                        "fleet_llm_budget_wait_seconds",
                        "How long a parked turn step waits for its slot in the provider's budget.",
                    )
                    .buckets(vec![0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0]),
                    &["provider"],
                )
                .expect("valid metric");
                registry.register(Box::new(h.clone())).expect("unique metric");
                h
            },
            llm_rate_limited: counter(
                "fleet_llm_rate_limited_total",
                "429 answers from a model provider (each pauses the provider fleet-wide).",
                &["provider"],
            ),
            tenant_turns_parked: counter(
                "fleet_tenant_turns_parked_total",
                "Turn steps parked because their tenant's turns were all running (its max concurrent turns).",
                &["tenant", "reason"],
            ),
            submissions_held: counter(
                "fleet_submissions_held_total",
                "Submissions of a tenant flooding the fleet that waited for one of its places in the dispatcher.",
                &["kind"],
            ),
            registry,
        }))
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("text encoding cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_and_unit_suffixed() {
        let m = Metrics::new("test");
        m.jobs_finished.with_label_values(&["tool_call", "success"]).inc();
        m.attempt_duration.with_label_values(&["tool_call"]).observe(0.01);
        let text = m.render();
        for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
            let name = line.split_whitespace().nth(2).unwrap();
            assert!(name.starts_with("fleet_"), "{name}");
            let kind = line.split_whitespace().nth(3).unwrap();
            if kind == "counter" {
                assert!(name.ends_with("_total"), "{name}");
            }
        }
        assert!(text.contains("fleet_jobs_finished_total{kind=\"tool_call\",outcome=\"success\"} 1"));
        assert!(text.contains("fleet_build_info{process=\"test\""));
    }
}
