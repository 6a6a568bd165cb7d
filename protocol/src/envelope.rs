//! The job envelope: the JSON body of every AMQP job message, and the checks that tell a job from poison.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The envelope version this build writes and accepts.
pub const ENVELOPE_VERSION: u32 = 1;
/// The only content type a job message may carry.
pub const CONTENT_TYPE: &str = "application/json";
/// AMQP header naming the envelope version (also inside the body as `v`).
pub const VERSION_HEADER: &str = "x-fleet-envelope";
/// Largest job body the worker will parse; anything larger is poison.
pub const MAX_ENVELOPE_BYTES: usize = 1024 * 1024;
/// Room a job keeps below `MAX_ENVELOPE_BYTES` when first published, for what its later
/// deliveries add (attempt times, `not_before_ms`, a poll's status URL).
pub const ENVELOPE_HEADROOM_BYTES: usize = 16 * 1024;
/// The most bytes a job's envelope adds to what its request carried (ids, times, kind, trace
/// context), generously: a request's JSON re-serialised is never longer than it was sent.
pub const ENVELOPE_OVERHEAD_BYTES: usize = 4 * 1024;

/// Whether a job made from a request of `request_bytes` (its JSON, or the part the job carries)
/// fits in an envelope with its retries' headroom. Checked before anything is recorded, so a job
/// that could not travel is refused rather than published over the limit.
pub fn request_fits_a_job(request_bytes: usize) -> bool {
    request_bytes + ENVELOPE_OVERHEAD_BYTES + ENVELOPE_HEADROOM_BYTES <= MAX_ENVELOPE_BYTES
}

/// What kind of work a job is; each kind has its own work queue and delay queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    ToolCall,
    Webhook,
    Turn,
}

impl JobKind {
    pub const ALL: [JobKind; 3] = [JobKind::ToolCall, JobKind::Webhook, JobKind::Turn];

    /// The kind `text` names (`as_str`'s inverse).
    pub fn parse(text: &str) -> Option<JobKind> {
        JobKind::ALL.into_iter().find(|k| k.as_str() == text)
    }

    /// Routing key on the jobs exchange, and the `kind` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::ToolCall => "tool_call",
            JobKind::Webhook => "webhook",
            JobKind::Turn => "turn",
        }
    }

    /// Plural used in queue names (`fleet.work.tool_calls`).
    pub fn queue_suffix(self) -> &'static str {
        match self {
            JobKind::ToolCall => "tool_calls",
            JobKind::Webhook => "webhooks",
            JobKind::Turn => "turns",
        }
    }
}

/// A tool callback to run: the seed's callback body minus what the worker adds at send time.
/// The callback URL and secret are deliberately absent: the worker reads them from the registry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallJob {
    pub tool_name: String,
    pub parameters: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub room_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assistant_id: Option<String>,
    /// The agent turn waiting for this call's result, if a model made the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<TurnParent>,
}

/// Which turn (and which of its tool calls) a tool-call job answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnParent {
    pub turn_execution_id: String,
    /// The model's id for the call (what the model is answered with); not unique: models reuse
    /// ids across rounds, and some give none.
    pub call_id: String,
    pub round: u32,
    /// The call's place in its round's answer: with the round, its key (`turn::call_key`).
    /// Absent in jobs published before calls were keyed by position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u32>,
    /// The agent's tool configuration the model called (seed 001): its argument overrides are
    /// resolved against the session at each attempt, never carried in the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<String>,
    /// The approval that holds the call (`approvals::approval_id`): the job runs only as its
    /// decision (or deadline) allows. The job first waits in the broker until that deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<String>,
}

impl TurnParent {
    /// The key the turn keeps this call's outcome under.
    pub fn call_key(&self) -> String {
        match self.position {
            Some(position) => crate::turn::call_key(self.round, position),
            None => self.call_id.clone(),
        }
    }
}

/// One model step of an agent turn: the turn's state lives in Redis; the job names the step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnJob {
    pub session_id: String,
    pub round: u32,
}

/// A signed event delivery to a subscribed webhook. The URL and secret come from the registry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookJob {
    pub webhook_id: String,
    pub event: String,
    /// The exact body to deliver: `{"event": …, "data": …}`.
    pub payload: Value,
}

/// The work itself, tagged by kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Job {
    ToolCall(ToolCallJob),
    Webhook(WebhookJob),
    Turn(TurnJob),
}

impl Job {
    pub fn kind(&self) -> JobKind {
        match self {
            Job::ToolCall(_) => JobKind::ToolCall,
            Job::Webhook(_) => JobKind::Webhook,
            Job::Turn(_) => JobKind::Turn,
        }
    }
}

/// One job message as it travels through the work and delay queues.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    pub v: u32,
    pub execution_id: String,
    /// The 1-based attempt this delivery is.
    pub attempt: u32,
    /// How many times an operator revived the execution from its dead letter: a copy of a job from
    /// before a replay is a copy, whatever its attempt (`life::Step`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gen: u32,
    /// When the dispatcher accepted the job (ms since epoch): the start of end-to-end latency.
    pub enqueued_at_ms: i64,
    /// When attempt 1 started, once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_attempt_at_ms: Option<i64>,
    /// The job must not run before this time (ms since epoch); set when a wait outlasts one delay queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before_ms: Option<i64>,
    /// Set while a tool's 202 is being polled: the next delivery GETs the status URL instead of
    /// POSTing the callback. Absent in envelopes written before polling lived in the broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll: Option<PollState>,
    /// Set when the job's end is already decided (the broker gave up on it, or carrying out the
    /// dead letter failed half-way): its next delivery only settles it, nothing runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle: Option<Verdict>,
    /// Set on a delivery parked by its step's claim holder (over a budget, a tenant's turn slots,
    /// a tool's limits): the token of the claim it gave back. The record is marked with it once
    /// the publish is confirmed, so a copy of the step arriving meanwhile is only a copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park: Option<u64>,
    #[serde(flatten)]
    pub job: Job,
}

/// Why a job was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DeadLetterReason {
    /// All attempts failed with retryable errors.
    Exhausted,
    /// The tool owner answered with a permanent failure (or the target is forbidden).
    Permanent,
    /// The message could not be parsed as a job.
    Poison,
    /// The job was delivered too many times without finishing (it kept losing its worker).
    DeliveryLimit,
}

impl DeadLetterReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::Exhausted => "exhausted",
            DeadLetterReason::Permanent => "permanent",
            DeadLetterReason::Poison => "poison",
            DeadLetterReason::DeliveryLimit => "delivery_limit",
        }
    }
}

/// A decided dead letter travelling with its job (see `Envelope::settle`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub reason: DeadLetterReason,
    pub error: String,
}

/// The error a delivery-limit dead letter records.
pub fn delivery_limit_error(deliveries: u64) -> String {
    format!("the job was delivered {deliveries} times without finishing (its worker kept failing on it)")
}

/// Whether a delivery seen `delivery_count` times before (the broker's `x-delivery-count`) has
/// used up `max_deliveries`.
pub fn delivery_limit_reached(delivery_count: u64, max_deliveries: u64) -> bool {
    delivery_count >= max_deliveries
}

/// An attempt that was answered 202 and is polled from the broker, one delivery per poll.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PollState {
    /// Absolute (already resolved against the callback URL).
    pub status_url: String,
    /// After this (ms since epoch) a still-pending answer fails the attempt retryably.
    pub deadline_ms: i64,
    /// When the attempt's POST was sent: the attempt's start in its history.
    pub started_at_ms: i64,
    /// Which poll of the attempt this is (1 for the first): part of the delivery's step.
    #[serde(default)]
    pub seq: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Envelope {
    /// This job as a fresh first attempt (what a dead letter keeps for replay).
    pub fn as_first_attempt(&self) -> Envelope {
        Envelope {
            attempt: 1,
            first_attempt_at_ms: None,
            not_before_ms: None,
            poll: None,
            settle: None,
            park: None,
            ..self.clone()
        }
    }

    /// A fresh job at attempt 1.
    pub fn new(execution_id: String, job: Job, now_ms: i64) -> Self {
        Envelope {
            v: ENVELOPE_VERSION,
            execution_id,
            attempt: 1,
            gen: 0,
            enqueued_at_ms: now_ms,
            first_attempt_at_ms: None,
            not_before_ms: None,
            poll: None,
            settle: None,
            park: None,
            job,
        }
    }

    pub fn kind(&self) -> JobKind {
        self.job.kind()
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an envelope always serialises")
    }

    /// Whether a new job is small enough to publish: a larger one (with the headroom its retries
    /// and polls need) would be poison to the worker. `Err` holds its encoded size.
    pub fn check_publishable_size(&self) -> Result<(), usize> {
        let size = self.to_bytes().len();
        match size + ENVELOPE_HEADROOM_BYTES <= MAX_ENVELOPE_BYTES {
            true => Ok(()),
            false => Err(size),
        }
    }

    /// Parses a delivery's body, refusing anything that is not a job this build can run.
    pub fn decode(body: &[u8], content_type: Option<&str>) -> Result<Envelope, PoisonReason> {
        match content_type {
            Some(ct) if ct.split(';').next().map(str::trim) == Some(CONTENT_TYPE) => {}
            Some(other) => return Err(PoisonReason::ContentType(Some(truncate(other, 100)))),
            None => return Err(PoisonReason::ContentType(None)),
        }
        if body.len() > MAX_ENVELOPE_BYTES {
            return Err(PoisonReason::TooLarge(body.len()));
        }
        // A well-formed job parses once, straight into its struct; anything else is parsed again,
        // step by step, only to say what is wrong with it.
        if let Ok(envelope) = serde_json::from_slice::<Envelope>(body) {
            if envelope.v == ENVELOPE_VERSION {
                envelope.validate()?;
                return Ok(envelope);
            }
        }
        let value: Value = serde_json::from_slice(body).map_err(|e| PoisonReason::NotJson(e.to_string()))?;
        match value.get("v").and_then(Value::as_u64) {
            Some(v) if v == ENVELOPE_VERSION as u64 => {}
            Some(v) => return Err(PoisonReason::Version(Some(v))),
            None => return Err(PoisonReason::Version(None)),
        }
        let envelope: Envelope = serde_json::from_value(value).map_err(|e| PoisonReason::Shape(e.to_string()))?;
        envelope.validate()?;
        Ok(envelope)
    }

    fn validate(&self) -> Result<(), PoisonReason> {
        if !is_valid_execution_id(&self.execution_id) {
            return Err(PoisonReason::Shape("execution_id must look like exec_<1-64 [A-Za-z0-9_-]>".into()));
        }
        if self.attempt == 0 {
            return Err(PoisonReason::Shape("attempt must be at least 1".into()));
        }
        match &self.job {
            Job::ToolCall(call) if call.tool_name.is_empty() => {
                Err(PoisonReason::Shape("tool_name must not be empty".into()))
            }
            Job::ToolCall(_) => Ok(()),
            Job::Webhook(w) if w.webhook_id.is_empty() || w.event.is_empty() => {
                Err(PoisonReason::Shape("webhook_id and event must not be empty".into()))
            }
            Job::Webhook(_) => Ok(()),
            Job::Turn(t) if t.session_id.is_empty() => Err(PoisonReason::Shape("session_id must not be empty".into())),
            Job::Turn(_) => Ok(()),
        }
    }
}

/// Whether `id` has the `exec_…` form the fleet issues (bounded, safe inside Redis keys and headers).
pub fn is_valid_execution_id(id: &str) -> bool {
    match id.strip_prefix("exec_") {
        Some(rest) => {
            !rest.is_empty()
                && rest.len() <= 64
                && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        }
        None => false,
    }
}

/// Why a message on a work queue cannot be run; it goes to the dead-letter queue with this reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PoisonReason {
    #[error("content type must be application/json, got {}", .0.as_deref().unwrap_or("none"))]
    ContentType(Option<String>),
    #[error("body is {0} bytes, above the 1 MiB limit")]
    TooLarge(usize),
    #[error("body is not JSON: {0}")]
    NotJson(String),
    #[error("envelope version must be 1, got {}", .0.map(|v| v.to_string()).unwrap_or_else(|| "none".into()))]
    Version(Option<u64>),
    #[error("envelope is malformed: {0}")]
    Shape(String),
}

fn truncate(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Envelope {
        Envelope::new(
            "exec_abc".into(),
            Job::ToolCall(ToolCallJob {
                tool_name: "search".into(),
                parameters: json!({"q": "laptop"}),
                room_id: Some("room_1".into()),
                assistant_id: None,
                parent: None,
            }),
            1_000,
        )
    }

    #[test]
    fn round_trips() {
        let e = sample();
        let decoded = Envelope::decode(&e.to_bytes(), Some("application/json")).unwrap();
        assert_eq!(decoded, e);
        assert_eq!(decoded.kind(), JobKind::ToolCall);
    }

    #[test]
    fn a_parked_delivery_carries_its_park_and_older_envelopes_have_none() {
        let v: Value = serde_json::from_slice(&sample().to_bytes()).unwrap();
        assert!(v.get("park").is_none(), "absent unless parked by a claim");
        let parked = Envelope { park: Some(7), ..sample() };
        let decoded = Envelope::decode(&parked.to_bytes(), Some("application/json")).unwrap();
        assert_eq!(decoded.park, Some(7));
        assert_eq!(decoded.as_first_attempt().park, None, "a replay starts unparked");
    }

    #[test]
    fn the_wire_form_is_flat_and_tagged() {
        let v: Value = serde_json::from_slice(&sample().to_bytes()).unwrap();
        assert_eq!(v["kind"], "tool_call");
        assert_eq!(v["tool_name"], "search");
        assert_eq!(v["v"], 1);
        assert!(v.get("callback_secret").is_none());
    }

    #[test]
    fn envelopes_without_poll_state_still_decode_and_poll_state_round_trips() {
        let old = br#"{"v":1,"execution_id":"exec_a","attempt":2,"enqueued_at_ms":1,"kind":"tool_call","tool_name":"t","parameters":{}}"#;
        assert_eq!(Envelope::decode(old, Some(CONTENT_TYPE)).unwrap().poll, None);
        let polled = Envelope {
            poll: Some(PollState {
                status_url: "https://t.example/s/1".into(),
                deadline_ms: 9,
                started_at_ms: 3,
                seq: 2,
            }),
            ..sample()
        };
        assert_eq!(Envelope::decode(&polled.to_bytes(), Some(CONTENT_TYPE)).unwrap(), polled);
    }

    #[test]
    fn a_verdict_travels_with_its_job_and_a_replay_drops_it() {
        let verdict = Verdict { reason: DeadLetterReason::DeliveryLimit, error: delivery_limit_error(20) };
        let decided = Envelope { settle: Some(verdict.clone()), attempt: 3, ..sample() };
        let decoded = Envelope::decode(&decided.to_bytes(), Some(CONTENT_TYPE)).unwrap();
        assert_eq!(decoded.settle, Some(verdict));
        let fresh = decoded.as_first_attempt();
        assert_eq!((fresh.settle, fresh.attempt), (None, 1));
        assert!(!delivery_limit_reached(9, 10) && delivery_limit_reached(10, 10));
    }

    #[test]
    fn poison_is_named() {
        let good = sample().to_bytes();
        assert!(matches!(Envelope::decode(&good, None), Err(PoisonReason::ContentType(None))));
        assert!(matches!(Envelope::decode(&good, Some("text/plain")), Err(PoisonReason::ContentType(_))));
        assert!(matches!(Envelope::decode(b"{nope", Some(CONTENT_TYPE)), Err(PoisonReason::NotJson(_))));
        let v2 = br#"{"v":2,"execution_id":"exec_a","attempt":1,"enqueued_at_ms":1,"kind":"tool_call","tool_name":"t","parameters":{}}"#;
        assert_eq!(Envelope::decode(v2, Some(CONTENT_TYPE)), Err(PoisonReason::Version(Some(2))));
        let bad_kind = br#"{"v":1,"execution_id":"exec_a","attempt":1,"enqueued_at_ms":1,"kind":"mine_bitcoin"}"#;
        assert!(matches!(Envelope::decode(bad_kind, Some(CONTENT_TYPE)), Err(PoisonReason::Shape(_))));
        let bad_id = br#"{"v":1,"execution_id":"../etc","attempt":1,"enqueued_at_ms":1,"kind":"tool_call","tool_name":"t","parameters":{}}"#;
        assert!(matches!(Envelope::decode(bad_id, Some(CONTENT_TYPE)), Err(PoisonReason::Shape(_))));
        let huge = vec![b' '; MAX_ENVELOPE_BYTES + 1];
        assert!(matches!(Envelope::decode(&huge, Some(CONTENT_TYPE)), Err(PoisonReason::TooLarge(_))));
    }

    #[test]
    fn a_job_is_publishable_only_with_room_for_its_retries() {
        assert_eq!(sample().check_publishable_size(), Ok(()));
        let sized = |n: usize| Envelope {
            job: Job::ToolCall(ToolCallJob {
                tool_name: "t".into(),
                parameters: json!({"q": "x".repeat(n)}),
                room_id: None,
                assistant_id: None,
                parent: None,
            }),
            ..sample()
        };
        let base = sized(0).to_bytes().len();
        let limit = MAX_ENVELOPE_BYTES - ENVELOPE_HEADROOM_BYTES;
        assert_eq!(sized(limit - base).check_publishable_size(), Ok(()));
        assert_eq!(sized(limit - base + 1).check_publishable_size(), Err(limit + 1));
        let poison = sized(MAX_ENVELOPE_BYTES);
        assert!(matches!(Envelope::decode(&poison.to_bytes(), Some(CONTENT_TYPE)), Err(PoisonReason::TooLarge(_))));
        assert!(poison.check_publishable_size().is_err());
    }

    #[test]
    fn execution_ids_are_bounded() {
        assert!(is_valid_execution_id("exec_0190abc-DEF_1"));
        assert!(!is_valid_execution_id("exec_"));
        assert!(!is_valid_execution_id("job_1"));
        assert!(!is_valid_execution_id(&format!("exec_{}", "a".repeat(65))));
        assert!(!is_valid_execution_id("exec_a b"));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // Bounded by proptest's default case count, so it runs in CI on every build.
        #[test]
        fn decoding_arbitrary_bytes_never_panics(body in proptest::collection::vec(any::<u8>(), 0..2048), json_ct in any::<bool>()) {
            let ct = if json_ct { Some(CONTENT_TYPE) } else { None };
            let _ = Envelope::decode(&body, ct);
        }

        #[test]
        fn decoding_arbitrary_json_never_panics(text in "\\PC{0,300}") {
            let _ = Envelope::decode(text.as_bytes(), Some(CONTENT_TYPE));
            let wrapped = format!(r#"{{"v":1,"execution_id":"exec_a","attempt":1,"enqueued_at_ms":1,"kind":"tool_call","tool_name":{:?},"parameters":{{}}}}"#, text);
            let _ = Envelope::decode(wrapped.as_bytes(), Some(CONTENT_TYPE));
        }

        #[test]
        fn valid_envelopes_round_trip(id in "[A-Za-z0-9_-]{1,64}", tool in "[a-z_]{1,20}", attempt in 1u32..7, q in "\\PC{0,50}") {
            let e = Envelope::new(format!("exec_{id}"), Job::ToolCall(ToolCallJob {
                tool_name: tool, parameters: serde_json::json!({"q": q}), room_id: None, assistant_id: None, parent: None,
            }), 5);
            let e = Envelope { attempt, ..e };
            prop_assert_eq!(Envelope::decode(&e.to_bytes(), Some(CONTENT_TYPE)).unwrap(), e);
        }
    }

    #[test]
    fn a_request_fits_a_job_only_with_the_envelopes_overhead_and_headroom() {
        let most = MAX_ENVELOPE_BYTES - ENVELOPE_HEADROOM_BYTES - ENVELOPE_OVERHEAD_BYTES;
        assert!(request_fits_a_job(most));
        assert!(!request_fits_a_job(most + 1));
        let call = Job::ToolCall(ToolCallJob {
            tool_name: "t".into(),
            parameters: serde_json::json!({"blob": "x".repeat(most - 64)}),
            room_id: Some("r".repeat(200)),
            assistant_id: Some("a".repeat(200)),
            parent: None,
        });
        let envelope = Envelope::new("exec_0123456789abcdef0123456789abcdef".into(), call, 1);
        assert_eq!(envelope.check_publishable_size(), Ok(()), "the overhead bounds what an envelope adds");
    }
}
