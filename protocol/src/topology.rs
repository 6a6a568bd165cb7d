//! AMQP topology as plain data: exchange and queue names derived from one prefix, and the arguments
//! each queue is declared with. The platform crate turns these specs into broker declarations.

use std::time::Duration;

use crate::envelope::JobKind;
use crate::retry::{delay_ladder, ladder_step};

/// The kinds a client submits that have a light lane (`Topology::light_queue`): new turns and
/// tool calls. Webhooks belong to no tenant.
pub const LANE_KINDS: [JobKind; 2] = [JobKind::Turn, JobKind::ToolCall];

/// The jobs exchange's routing key of `kind`'s light lane (`turn.light`, `tool_call.light`).
pub fn light_key(kind: JobKind) -> Option<String> {
    LANE_KINDS.contains(&kind).then(|| format!("{}{LIGHT_SUFFIX}", kind.as_str()))
}

const LIGHT_SUFFIX: &str = ".light";

/// Whether `routing_key` is `kind`'s light lane's (`light_key`), without building the key: a worker
/// asks it of every delivery.
pub fn is_light_key(kind: JobKind, routing_key: &str) -> bool {
    LANE_KINDS.contains(&kind) && routing_key.strip_suffix(LIGHT_SUFFIX) == Some(kind.as_str())
}

/// Redeliveries after which the broker itself dead-letters a message (a job that keeps killing
/// its worker must not crash-loop the fleet).
pub const WORK_QUEUE_DELIVERY_LIMIT: i64 = 20;

/// A queue argument value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgValue {
    Str(String),
    Int(i64),
}

/// One queue to declare: its name, `x-` arguments and bindings (exchange, routing key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    pub name: String,
    pub arguments: Vec<(&'static str, ArgValue)>,
    pub bindings: Vec<(String, String)>,
}

/// The exchange types the fleet uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeType {
    Direct,
    Fanout,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExchangeSpec {
    pub name: String,
    pub kind: ExchangeType,
}

/// Every name in the fleet's topology, derived from `prefix` and the retry delays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    prefix: String,
    delays: Vec<Duration>,
    /// Every delay queue's TTL: the retry delays and the park delays (`retry::delay_ladder`).
    ladder: Vec<Duration>,
}

impl Topology {
    pub fn new(prefix: impl Into<String>, delays: Vec<Duration>) -> Self {
        Topology { prefix: prefix.into(), ladder: delay_ladder(&delays), delays }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The retry delays (`FLEET_RETRY_DELAYS`) the topology was built from.
    pub fn delays(&self) -> &[Duration] {
        &self.delays
    }

    /// Every delay queue's TTL, ascending: a step of [`Topology::delay_queue`] indexes into it.
    pub fn ladder(&self) -> &[Duration] {
        &self.ladder
    }

    /// Where the dispatcher publishes new jobs and where delay queues return them (direct, by kind).
    pub fn jobs_exchange(&self) -> String {
        format!("{}.jobs", self.prefix)
    }

    /// Fanout into the dead-letter queue.
    pub fn dead_letter_exchange(&self) -> String {
        format!("{}.dead", self.prefix)
    }

    pub fn work_queue(&self, kind: JobKind) -> String {
        format!("{}.work.{}", self.prefix, kind.queue_suffix())
    }

    /// `kind`'s light lane, if it has one: new jobs of tenants that are not flooding the fleet (the
    /// dispatcher's `fair::LaneBucket`), published to the jobs exchange under `light_key`, so they
    /// never wait behind another tenant's backlog in the work queue. Workers consume it beside the
    /// work queues; retries, parked jobs and a turn's later steps go to the work queue.
    pub fn light_queue(&self, kind: JobKind) -> Option<String> {
        LANE_KINDS.contains(&kind).then(|| format!("{}.light", self.work_queue(kind)))
    }

    /// The queues where `kind`'s jobs wait for a worker: its work queue and its light lane.
    /// Workers consume them all; depths and readiness count them together.
    pub fn waiting_queues(&self, kind: JobKind) -> Vec<String> {
        std::iter::once(self.work_queue(kind)).chain(self.light_queue(kind)).collect()
    }

    /// The delay queue of ladder step `step` (0 = the shortest, 250 ms; `RetryPolicy::park_step`
    /// picks the step for a wait).
    pub fn delay_queue(&self, kind: JobKind, step: usize) -> String {
        format!("{}.delay.{}.{}", self.prefix, kind.queue_suffix(), duration_label(self.ladder[step]))
    }

    /// The delay queue that holds a job waiting `remaining` first: the longest that does not
    /// overshoot (see `retry::ladder_step`).
    pub fn park_queue(&self, kind: JobKind, remaining: Duration) -> String {
        self.delay_queue(kind, ladder_step(&self.ladder, remaining))
    }

    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dead_letters", self.prefix)
    }

    pub fn exchanges(&self) -> Vec<ExchangeSpec> {
        vec![
            ExchangeSpec { name: self.jobs_exchange(), kind: ExchangeType::Direct },
            ExchangeSpec { name: self.dead_letter_exchange(), kind: ExchangeType::Fanout },
        ]
    }

    /// Every queue, in declaration order: per job kind its work queue and one delay queue per
    /// ladder step (retry delays and park delays). All are durable quorum queues; the delay and work queues
    /// dead-letter at-least-once (which needs `reject-publish` overflow) so a retry is never dropped.
    pub fn queues(&self) -> Vec<QueueSpec> {
        let quorum = || ("x-queue-type", ArgValue::Str("quorum".into()));
        let at_least_once = || {
            [
                ("x-dead-letter-strategy", ArgValue::Str("at-least-once".into())),
                ("x-overflow", ArgValue::Str("reject-publish".into())),
            ]
        };
        let mut queues = Vec::new();
        for kind in JobKind::ALL {
            let mut arguments = vec![
                quorum(),
                ("x-dead-letter-exchange", ArgValue::Str(self.dead_letter_exchange())),
                ("x-delivery-limit", ArgValue::Int(WORK_QUEUE_DELIVERY_LIMIT)),
            ];
            arguments.extend(at_least_once());
            queues.push(QueueSpec {
                name: self.work_queue(kind),
                arguments: arguments.clone(),
                bindings: vec![(self.jobs_exchange(), kind.as_str().to_string())],
            });
            if let (Some(name), Some(key)) = (self.light_queue(kind), light_key(kind)) {
                queues.push(QueueSpec { name, arguments, bindings: vec![(self.jobs_exchange(), key)] });
            }
            for (step, delay) in self.ladder.iter().enumerate() {
                let mut arguments = vec![
                    quorum(),
                    ("x-message-ttl", ArgValue::Int(delay.as_millis() as i64)),
                    ("x-dead-letter-exchange", ArgValue::Str(self.jobs_exchange())),
                    ("x-dead-letter-routing-key", ArgValue::Str(kind.as_str().to_string())),
                ];
                arguments.extend(at_least_once());
                queues.push(QueueSpec { name: self.delay_queue(kind, step), arguments, bindings: vec![] });
            }
        }
        queues.push(QueueSpec {
            name: self.dead_letter_queue(),
            arguments: vec![quorum()],
            bindings: vec![(self.dead_letter_exchange(), String::new())],
        });
        queues
    }
}

/// `1s`, `16s`, `250ms`: a delay as it appears in a queue name.
pub fn duration_label(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_topology() -> Topology {
        Topology::new("fleet", [1, 2, 4, 8, 16].map(Duration::from_secs).to_vec())
    }

    #[test]
    fn names_follow_the_prefix() {
        let t = default_topology();
        assert_eq!(t.jobs_exchange(), "fleet.jobs");
        assert_eq!(t.work_queue(JobKind::ToolCall), "fleet.work.tool_calls");
        assert_eq!(t.delay_queue(JobKind::ToolCall, 0), "fleet.delay.tool_calls.250ms");
        assert_eq!(t.delay_queue(JobKind::ToolCall, 1), "fleet.delay.tool_calls.1s");
        assert_eq!(t.park_queue(JobKind::ToolCall, Duration::from_secs(16)), "fleet.delay.tool_calls.16s");
        assert_eq!(t.park_queue(JobKind::Webhook, Duration::from_secs(7200)), "fleet.delay.webhooks.3600s");
        assert_eq!(t.dead_letter_queue(), "fleet.dead_letters");
    }

    #[test]
    fn delay_queues_hold_then_return_to_the_jobs_exchange() {
        let t = default_topology();
        let queues = t.queues();
        let delay = queues.iter().find(|q| q.name == "fleet.delay.tool_calls.4s").unwrap();
        assert!(delay.arguments.contains(&("x-message-ttl", ArgValue::Int(4000))));
        assert!(delay.arguments.contains(&("x-dead-letter-exchange", ArgValue::Str("fleet.jobs".into()))));
        assert!(delay.arguments.contains(&("x-dead-letter-routing-key", ArgValue::Str("tool_call".into()))));
        assert!(delay.arguments.contains(&("x-dead-letter-strategy", ArgValue::Str("at-least-once".into()))));
        assert!(queues.iter().all(|q| q.arguments.contains(&("x-queue-type", ArgValue::Str("quorum".into())))));
        // Per kind: the work queue, 5 retry delay queues and 5 park queues; the light lanes of
        // turns and tool calls; then the dead letters.
        assert_eq!(queues.len(), JobKind::ALL.len() * (1 + 5 + 5) + 2 + 1);
        for (kind, key) in [("turns", "turn.light"), ("tool_calls", "tool_call.light")] {
            let work = queues.iter().find(|q| q.name == format!("fleet.work.{kind}")).unwrap();
            let light = queues.iter().find(|q| q.name == format!("fleet.work.{kind}.light")).unwrap();
            assert_eq!(light.arguments, work.arguments, "the lane is a work queue like the {kind}'");
            assert_eq!(light.bindings, [("fleet.jobs".to_string(), key.to_string())]);
        }
        assert_eq!(t.light_queue(JobKind::Webhook), None, "webhooks belong to no tenant");
        assert!(is_light_key(JobKind::ToolCall, "tool_call.light") && !is_light_key(JobKind::ToolCall, "tool_call"));
        assert!(!is_light_key(JobKind::Webhook, "webhook.light") && !is_light_key(JobKind::Turn, "tool_call.light"));
        assert_eq!(t.waiting_queues(JobKind::ToolCall), ["fleet.work.tool_calls", "fleet.work.tool_calls.light"]);
    }

    #[test]
    fn every_kind_has_the_park_queues_and_the_retry_delays() {
        let t = default_topology();
        let names: Vec<String> = t.queues().into_iter().map(|q| q.name).collect();
        for label in ["250ms", "1s", "2s", "4s", "5s", "8s", "16s", "60s", "600s", "3600s"] {
            assert!(names.contains(&format!("fleet.delay.turns.{label}")), "no {label} queue: {names:?}");
        }
        let hour = t.queues().into_iter().find(|q| q.name == "fleet.delay.turns.3600s").unwrap();
        assert!(hour.arguments.contains(&("x-message-ttl", ArgValue::Int(3_600_000))));
        // The policy and the topology agree on which step is which queue.
        let policy = crate::retry::RetryPolicy::default();
        assert_eq!(policy.ladder(), t.ladder());
        let wait = Duration::from_secs(45);
        assert_eq!(t.delay_queue(JobKind::Turn, policy.park_step(wait)), t.park_queue(JobKind::Turn, wait));
        assert_eq!(t.park_queue(JobKind::Turn, wait), "fleet.delay.turns.16s");
    }

    #[test]
    fn sub_second_delays_are_named_in_milliseconds() {
        assert_eq!(duration_label(Duration::from_millis(250)), "250ms");
        assert_eq!(duration_label(Duration::from_secs(2)), "2s");
    }
}
