//! One tool-callback attempt: look up the tool, sign the seed's body afresh, POST it (or, while a
//! 202 is being polled, GET its status URL), and say what the answer means.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use fleet_platform::now_ms;
use fleet_platform::store::Store;
use fleet_protocol::callback::{async_status_url, resolve_status_url, CallbackBody};
use fleet_protocol::classify::{classify_status, ResponseClass, TransportFailure};
use fleet_protocol::envelope::{Job, PollState, ToolCallJob};
use fleet_protocol::events::WEBHOOK_TIMEOUT_SECS;
use fleet_protocol::external_result::ExternalResult;
use fleet_protocol::sanitize::sanitize_error;
use fleet_protocol::secrets::SecretsKey;
use fleet_protocol::timefmt::rfc3339_from_millis;
use tracing::Instrument;

use crate::http::{CallbackClient, ReadResponse};
use crate::registry::Target;
use crate::signature::SigningKeys;

/// What an attempt came to.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptVerdict {
    Succeeded(Value),
    /// The answer was seed 002's structured result (any status): the call ends with it, not
    /// retried (a tool's own failure is its answer).
    Structured(Box<ExternalResult>),
    Retryable {
        retry_after: Option<Duration>,
    },
    Permanent,
    /// A 202 (or a poll still pending): the attempt goes on; poll `status_url` later, from the
    /// broker, until `deadline_ms`.
    Accepted(PollState),
}

/// An attempt's verdict plus what the history records of it.
#[derive(Debug, Clone)]
pub struct AttemptReport {
    pub verdict: AttemptVerdict,
    pub http_status: Option<u16>,
    pub error: Option<String>,
    /// Metric label: the status class or the transport failure.
    pub class: &'static str,
}

impl AttemptReport {
    fn transport(failure: TransportFailure) -> Self {
        let verdict = if failure.is_retryable() {
            AttemptVerdict::Retryable { retry_after: None }
        } else {
            AttemptVerdict::Permanent
        };
        AttemptReport { verdict, http_status: None, class: failure.label(), error: Some(failure.to_string()) }
    }

    fn permanent(error: String) -> Self {
        AttemptReport { verdict: AttemptVerdict::Permanent, http_status: None, error: Some(error), class: "refused" }
    }

    /// Nothing was sent, and trying again later may work (Redis did not answer).
    fn unsent(error: String) -> Self {
        let verdict = AttemptVerdict::Retryable { retry_after: None };
        AttemptReport { verdict, http_status: None, error: Some(error), class: "refused" }
    }
}

pub struct CallbackContext<'a> {
    pub store: &'a Store,
    /// The worker's MCP sessions, for a tool an MCP server lists.
    pub mcp: &'a fleet_platform::mcp::McpClients,
    pub(crate) mcp_servers: &'a crate::context::TtlCache<crate::context::McpServerEntry>,
    /// The data sources as this worker's queries last read them.
    pub(crate) data_source_entries: &'a crate::context::TtlCache<crate::context::DataSourceEntry>,
    /// The private networks a data source may be on (the operator's choice).
    pub data_source_networks: &'a fleet_platform::data_sources::PrivateNetworks,
    /// The worker's tool cache: a data source's extraction rewrites its tool.
    pub(crate) tools: &'a crate::context::ToolCache,
    pub targets: &'a crate::registry::TargetCache,
    pub callback_timeout: Duration,
    pub client: &'a CallbackClient,
    pub secrets: &'a SecretsKey,
    pub poll_limit: Duration,
    /// The worker's configured secrets, kept out of what a tool owner's answer puts in an error.
    pub redactor: &'a fleet_protocol::redact::Redactor,
}

/// A signed request ready to send.
struct Prepared {
    /// Where to send and how to sign: the cached target itself, not a copy of it.
    target: Arc<Target>,
    body: Vec<u8>,
    /// The signing time (the body's `timestamp` says the same).
    signed_at_ms: i64,
    timeout: Duration,
    /// Tool callbacks may answer 202 and be polled; for a webhook a 202 is simply delivered.
    poll_accepted: bool,
    /// The agent secrets the call's overrides put in it: scrubbed from whatever comes back.
    scrub: Vec<String>,
    /// An output sink's delivery: its `deliveryId`, which the sink's `OutputReceipt` must name.
    receipt_for: Option<String>,
}

/// Runs one attempt of `job` for `execution_id`: a tool callback or a webhook delivery, or one
/// poll of an accepted callback's status URL. Its error is redacted and sanitised for storing.
pub async fn attempt(
    ctx: &CallbackContext<'_>,
    execution_id: &str,
    job: &Job,
    poll: Option<&PollState>,
) -> AttemptReport {
    // The tool's (or webhook's) own secret is no configured one: an answer echoing it is scrubbed
    // of it with the configured ones, in one pass, where the answer enters the fleet.
    let (mut report, target, scrub) = match prepare(ctx, execution_id, job).await {
        Ok(mut prepared) => {
            let target = Arc::clone(&prepared.target);
            let scrub = std::mem::take(&mut prepared.scrub);
            let report = match poll {
                Some(poll) => poll_once(ctx, poll, execution_id, &prepared).await,
                None => post(ctx, prepared, execution_id).await,
            };
            (report, Some(target), scrub)
        }
        Err(report) => (report, None, vec![]),
    };
    let own = target.as_deref().map(|t| t.secret.as_str());
    let overridden = (!scrub.is_empty()).then(|| fleet_protocol::redact::Redactor::new(&scrub));
    // Redacted whole before sanitising: the sanitiser's cut could leave a secret's head.
    report.error = report.error.as_deref().map(|e| {
        let e = ctx.redactor.redact_with(own, e);
        let e = overridden.as_ref().map_or(e.clone(), |r| std::borrow::Cow::Owned(r.redact(&e).into_owned()));
        sanitize_error(&e)
    });
    let scrub_json = |value: &mut Value| {
        ctx.redactor.redact_json(own, value);
        if let Some(r) = &overridden {
            r.redact_json(None, value);
        }
    };
    match &mut report.verdict {
        AttemptVerdict::Succeeded(result) => scrub_json(result),
        AttemptVerdict::Structured(result) => {
            if let Job::ToolCall(call) = job {
                result.call_id = execution_id.to_string();
                result.source = call.tool_name.clone();
            }
            result.scrub_with(scrub_json);
        }
        _ => {}
    }
    report
}

async fn post(ctx: &CallbackContext<'_>, prepared: Prepared, execution_id: &str) -> AttemptReport {
    let signed =
        prepared.target.signing.headers(execution_id, prepared.signed_at_ms, &prepared.body, &prepared.target.secret);
    let signature = match signed {
        Ok(headers) => headers,
        Err(why) => return AttemptReport::permanent(why),
    };
    let mut request = prepared
        .target
        .post(ctx.client)
        .timeout(prepared.timeout)
        .header(reqwest::header::CONTENT_TYPE, "application/json");
    for (name, value) in signature {
        request = request.header(name, value);
    }
    let request = request.body(prepared.body);
    match traced_send(ctx, request, "POST").await {
        Ok(response) => {
            let report = judge(&response, &prepared.target.url, prepared.poll_accepted, &ctx.poll_deadline(None));
            match &prepared.receipt_for {
                Some(delivery_id) => receipt(report, &response.body, delivery_id),
                None => report,
            }
        }
        Err(failure) => AttemptReport::transport(failure),
    }
}

/// An output sink's 2xx is a delivery only when its `OutputReceipt` accepts it (seed 002): the
/// receipt is the delivery's result; `unknown` is tried again with the same `deliveryId`; a
/// rejection, another delivery's receipt or no receipt is never a success.
fn receipt(report: AttemptReport, body: &[u8], delivery_id: &str) -> AttemptReport {
    use fleet_protocol::output_sink::{judge_receipt, ReceiptVerdict};
    if !matches!(report.verdict, AttemptVerdict::Succeeded(_)) {
        return report;
    }
    let (verdict, error) = match judge_receipt(delivery_id, body) {
        ReceiptVerdict::Accepted(receipt) => (AttemptVerdict::Succeeded(receipt), None),
        ReceiptVerdict::Retry(why) => (AttemptVerdict::Retryable { retry_after: None }, Some(why)),
        ReceiptVerdict::Refused(why) => (AttemptVerdict::Permanent, Some(why)),
    };
    AttemptReport { verdict, error, ..report }
}

fn registry_unavailable(e: impl std::fmt::Display) -> AttemptReport {
    AttemptReport {
        verdict: AttemptVerdict::Retryable { retry_after: None },
        http_status: None,
        error: Some(format!("registry unavailable: {e}")),
        class: "registry",
    }
}

/// Sends `request` with the job's trace context as `traceparent`: from a client span of its own
/// when spans are exported, else as the job received it (no span is built for nothing, and the
/// send runs within the job's span as it is: entering it again on every poll showed in the
/// worker's profile).
async fn traced_send(
    ctx: &CallbackContext<'_>,
    mut request: reqwest::RequestBuilder,
    method: &'static str,
) -> Result<crate::http::ReadResponse, TransportFailure> {
    let exported = fleet_platform::telemetry::exporting()
        .then(|| tracing::info_span!("http", otel.name = method, otel.kind = "client", http.request.method = method));
    let headers = fleet_platform::telemetry::http_headers(exported.as_ref().unwrap_or(&tracing::Span::current()));
    for (name, value) in headers {
        request = request.header(name, value);
    }
    match exported {
        Some(span) => ctx.client.send(request).instrument(span).await,
        None => ctx.client.send(request).await,
    }
}

/// The registry entry a job names: a permanent failure once it is gone, a retryable one while the
/// registry cannot say.
fn registered<T>(
    found: Result<Option<T>, fleet_platform::store::StoreError>,
    what: &str,
    name: &str,
) -> Result<T, AttemptReport> {
    match found {
        Ok(Some(entry)) => Ok(entry),
        Ok(None) => Err(AttemptReport::permanent(format!("{what} {name:?} is no longer registered"))),
        Err(e) => Err(registry_unavailable(e)),
    }
}

/// A registry entry's stored keys: its secret's ciphertext and its signing state; `what` names
/// the secret in an error (`callback`, `webhook`).
struct StoredKeys<'a> {
    ciphertext: &'a str,
    signing: &'a fleet_protocol::signature_scheme::Signing,
    what: &'a str,
}

/// Where and how to send for `owner`: its secret decrypted and its signing keys at `at_ms`.
fn target(
    ctx: &CallbackContext<'_>,
    owner: &str,
    url: String,
    keys: StoredKeys<'_>,
    at_ms: i64,
) -> Result<Target, AttemptReport> {
    let secret = ctx
        .secrets
        .decrypt(owner, keys.ciphertext)
        .map_err(|e| AttemptReport::permanent(format!("{} secret cannot be used: {e}", keys.what)))?;
    let signing = SigningKeys::load(ctx.secrets, owner, keys.signing, at_ms);
    Ok(Target::new(url, secret, signing))
}

/// A call of an agent's tool configuration (seed 001): the model's parameters with the
/// configuration's overrides resolved now, against the live session, and the secrets they hold.
/// A call whose overrides cannot be resolved fails for good, naming what is missing.
async fn configured_parameters(
    ctx: &CallbackContext<'_>,
    call: &ToolCallJob,
) -> Result<(Option<serde_json::Value>, Vec<String>), AttemptReport> {
    let Some(parent) = call.parent.as_ref().filter(|p| p.configuration.is_some()) else { return Ok((None, vec![])) };
    let configuration = parent.configuration.as_deref().unwrap_or_default();
    let turn = &parent.turn_execution_id;
    let state = match ctx.store.sessions().load_turn(turn).await {
        Ok(Some(state)) => state,
        Ok(None) => return Err(AttemptReport::permanent("the call's turn is gone".into())),
        Err(e) => return Err(AttemptReport::unsent(format!("cannot read the call's turn: {e}"))),
    };
    let secrets = crate::overrides::Secrets::Opened(ctx.secrets);
    let resolved = crate::overrides::resolve(ctx.store, secrets, &state, turn, configuration)
        .await
        .map_err(AttemptReport::permanent)?;
    Ok((Some(resolved.apply(&call.parameters)), resolved.secrets))
}

/// Looks up the target and its secret, and builds the body signed at this attempt's time.
async fn prepare(ctx: &CallbackContext<'_>, execution_id: &str, job: &Job) -> Result<Prepared, AttemptReport> {
    let signed_at_ms = now_ms();
    let timestamp = rfc3339_from_millis(signed_at_ms);
    match job {
        Job::ToolCall(call) => {
            let owner = format!("tool:{}", call.tool_name);
            let target = match ctx.targets.get(&owner) {
                Some(t) => t,
                None => {
                    let tool =
                        registered(ctx.store.registry().get_tool(&call.tool_name).await, "tool", &call.tool_name)?;
                    let keys =
                        StoredKeys { ciphertext: &tool.secret_ciphertext, signing: &tool.signing, what: "callback" };
                    ctx.targets.put(&owner, target(ctx, &owner, tool.callback_url, keys, signed_at_ms)?)
                }
            };
            let (parameters, scrub) = configured_parameters(ctx, call).await?;
            let body = CallbackBody {
                tool_name: &call.tool_name,
                parameters: parameters.as_ref().unwrap_or(&call.parameters),
                execution_id,
                // A tool owner is told the session as its client named it, never a tenant's scope.
                room_id: call.room_id.as_deref().map(fleet_protocol::tenant::session_key_shown),
                assistant_id: call.assistant_id.as_deref(),
                timestamp: &timestamp,
            }
            .to_bytes();
            let timeout = ctx.callback_timeout;
            Ok(Prepared { target, body, signed_at_ms, timeout, poll_accepted: true, scrub, receipt_for: None })
        }
        Job::Turn(_) => Err(AttemptReport::permanent("a turn step is not a callback".into())),
        Job::Webhook(hook) => {
            let stored =
                registered(ctx.store.registry().get_webhook(&hook.webhook_id).await, "webhook", &hook.webhook_id)?;
            let owner = format!("webhook:{}", stored.id);
            let keys = StoredKeys { ciphertext: &stored.secret_ciphertext, signing: &stored.signing, what: "webhook" };
            let target = target(ctx, &owner, stored.url, keys, signed_at_ms)?;
            let body = serde_json::to_vec(&hook.payload).expect("a payload serialises");
            let receipt_for = (hook.event == fleet_protocol::events::OUTPUT_DELIVERY)
                .then(|| hook.payload["deliveryId"].as_str().unwrap_or_default().to_string());
            Ok(Prepared {
                receipt_for,
                target: Arc::new(target),
                body,
                signed_at_ms,
                timeout: Duration::from_secs(WEBHOOK_TIMEOUT_SECS),
                poll_accepted: false,
                scrub: vec![],
            })
        }
    }
}

impl CallbackContext<'_> {
    /// (attempt start, poll deadline) in ms: carried over while polling, else starting now.
    fn poll_deadline(&self, polling: Option<&PollState>) -> (i64, i64) {
        match polling {
            Some(p) => (p.started_at_ms, p.deadline_ms),
            None => {
                let now = now_ms();
                (now, now + self.poll_limit.as_millis() as i64)
            }
        }
    }
}

/// What the answer to a callback POST means. `window` is (attempt start, poll deadline) in ms.
fn judge(response: &ReadResponse, callback_url: &str, poll_accepted: bool, window: &(i64, i64)) -> AttemptReport {
    let status = response.status;
    let class = fleet_protocol::classify::status_class(status);
    let report = |verdict, error| AttemptReport { verdict, http_status: Some(status), error, class };
    match classify_status(status, response.retry_after.as_deref(), now_ms() / 1000) {
        ResponseClass::Accepted if !poll_accepted => report(AttemptVerdict::Succeeded(Value::Null), None),
        ResponseClass::Accepted => {
            let body: Value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
            let Some(reference) = async_status_url(&body, response.location.as_deref()) else {
                let why = "202 Accepted without a status_url or Location to poll";
                return report(AttemptVerdict::Permanent, Some(why.into()));
            };
            match resolve_status_url(callback_url, &reference) {
                Ok(status_url) => report(
                    AttemptVerdict::Accepted(PollState {
                        status_url,
                        started_at_ms: window.0,
                        deadline_ms: window.1,
                        seq: 0,
                    }),
                    None,
                ),
                Err(why) => report(AttemptVerdict::Permanent, Some(why)),
            }
        }
        // Structured results are a tool's: a webhook's (or a sink's) answer is judged as it is.
        other => match answer(other, response, "HTTP") {
            AttemptReport { verdict: AttemptVerdict::Structured(_), http_status, error, class } if !poll_accepted => {
                AttemptReport { verdict: AttemptVerdict::Succeeded(Value::Null), http_status, error, class }
            }
            report => report,
        },
    }
}

/// One poll of an accepted callback's status URL: a signed GET (empty body signed).
async fn poll_once(
    ctx: &CallbackContext<'_>,
    poll: &PollState,
    execution_id: &str,
    prepared: &Prepared,
) -> AttemptReport {
    let signature = match prepared.target.signing.headers(execution_id, now_ms(), b"", &prepared.target.secret) {
        Ok(headers) => headers,
        Err(why) => return AttemptReport::permanent(why),
    };
    let mut request = ctx.client.get(&poll.status_url).timeout(ctx.callback_timeout);
    for (name, value) in signature {
        request = request.header(name, value);
    }
    match traced_send(ctx, request, "GET").await {
        Ok(response) => poll_answer(&response, poll, now_ms()),
        Err(failure) => AttemptReport::transport(failure),
    }
}

/// What a status poll's answer means: 202 is still pending (poll again, unless the deadline has
/// passed: then the attempt times out, retryably); anything else is judged like a callback's answer.
fn poll_answer(response: &ReadResponse, poll: &PollState, now_ms: i64) -> AttemptReport {
    let status = response.status;
    let class = fleet_protocol::classify::status_class(status);
    match classify_status(status, response.retry_after.as_deref(), now_ms / 1000) {
        ResponseClass::Accepted if now_ms < poll.deadline_ms => AttemptReport {
            verdict: AttemptVerdict::Accepted(poll.clone()),
            http_status: Some(status),
            error: None,
            class,
        },
        ResponseClass::Accepted => {
            let limit = Duration::from_millis((poll.deadline_ms - poll.started_at_ms).max(0) as u64);
            AttemptReport {
                verdict: AttemptVerdict::Retryable { retry_after: None },
                http_status: Some(status),
                error: Some(format!("status poll still pending after {} s", limit.as_secs())),
                class: "timeout",
            }
        }
        other => answer(other, response, "status poll answered HTTP"),
    }
}

/// A final (not 202) answer: success, retryable or permanent, with `what` heading the error.
fn answer(class_of: ResponseClass, response: &ReadResponse, what: &str) -> AttemptReport {
    let status = response.status;
    let class = fleet_protocol::classify::status_class(status);
    let report = |verdict, error| AttemptReport { verdict, http_status: Some(status), error, class };
    match class_of {
        ResponseClass::Success | ResponseClass::Accepted => report(verdict_of(&response.body), None),
        ResponseClass::Retryable { retry_after } => report(
            AttemptVerdict::Retryable { retry_after },
            Some(format!("{what} {status}{}", excerpt(&response.body))),
        ),
        ResponseClass::Permanent => {
            report(AttemptVerdict::Permanent, Some(format!("{what} {status}{}", excerpt(&response.body))))
        }
    }
}

/// A 2xx answer's verdict: seed 002's structured result when the body (bare, or its `result`) is
/// one (its call id and source are filled in by `attempt`), else the seed's result.
fn verdict_of(body: &[u8]) -> AttemptVerdict {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let shaped = parsed.as_ref().and_then(|body| match body.get("result") {
        Some(result) => ExternalResult::from_answer("", "", result),
        None => ExternalResult::from_answer("", "", body),
    });
    match shaped {
        Some(result) => AttemptVerdict::Structured(Box::new(result)),
        None => AttemptVerdict::Succeeded(result_of(body)),
    }
}

/// The tool result: `result` of the seed's `{"result": …}` body. The seed's table makes any
/// 200/201 a success, but only that field is the tool's result: any other answer (empty, text, an
/// object without `result`, such as a receiver's own bookkeeping) is a success with no result,
/// never mistaken for one.
fn result_of(body: &[u8]) -> Value {
    match serde_json::from_slice(body) {
        Ok(Value::Object(mut map)) => map.remove("result").unwrap_or(Value::Null),
        _ => Value::Null,
    }
}

/// An error body for the attempt history, sanitised (one short line, no credentials or traces).
fn excerpt(body: &[u8]) -> String {
    let head = &body[..body.len().min(8 * 1024)];
    let text = sanitize_error(&String::from_utf8_lossy(head));
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn response(status: u16, body: &str, location: Option<&str>) -> ReadResponse {
        ReadResponse {
            status,
            retry_after: None,
            location: location.map(str::to_string),
            body: bytes::Bytes::from(body.to_string()),
        }
    }

    #[test]
    fn results_come_from_the_result_field_or_the_body_text() {
        assert_eq!(result_of(br#"{"result": {"n": 1}}"#), json!({"n": 1}));
        assert_eq!(result_of(br#"{"result": null}"#), Value::Null);
        for not_a_result in [&br#"{"state":"claimed","token":3}"#[..], b"", b"OK", b"[1]"] {
            assert_eq!(result_of(not_a_result), Value::Null, "{}", String::from_utf8_lossy(not_a_result));
        }
    }

    #[test]
    fn structured_answers_are_read_bare_or_inside_result() {
        let failed = br#"{"status":"failed","error":{"code":"NOT_FOUND","message":"gone"}}"#;
        let wrapped = br#"{"result":{"status":"failed","error":{"code":"NOT_FOUND","message":"gone"}}}"#;
        for body in [&failed[..], &wrapped[..]] {
            let AttemptVerdict::Structured(r) = verdict_of(body) else { panic!("{}", String::from_utf8_lossy(body)) };
            assert_eq!(r.error.unwrap().code, "NOT_FOUND");
        }
        assert_eq!(
            verdict_of(br#"{"result":{"status":"shipped"}}"#),
            AttemptVerdict::Succeeded(json!({"status": "shipped"}))
        );
        assert!(matches!(verdict_of(br#"{"structuredContent":{"a":1}}"#), AttemptVerdict::Structured(_)));
    }

    #[test]
    fn the_seeds_response_table() {
        let window = (1_000, 301_000);
        let judge =
            |status, body, location| judge(&response(status, body, location), "http://t.example/a/b", true, &window);
        assert_eq!(judge(200, "OK", None).verdict, AttemptVerdict::Succeeded(Value::Null));
        assert_eq!(judge(201, r#"{"result":1}"#, None).verdict, AttemptVerdict::Succeeded(json!(1)));
        let accepted = |status_url: &str| {
            AttemptVerdict::Accepted(PollState {
                status_url: status_url.into(),
                started_at_ms: 1_000,
                deadline_ms: 301_000,
                seq: 0,
            })
        };
        assert_eq!(judge(202, r#"{"status_url":"/s/1"}"#, None).verdict, accepted("http://t.example/s/1"));
        assert_eq!(judge(202, "", Some("s/1")).verdict, accepted("http://t.example/a/s/1"));
        assert_eq!(judge(202, "", None).verdict, AttemptVerdict::Permanent);
        for status in [400, 401, 404, 302] {
            assert_eq!(judge(status, "", None).verdict, AttemptVerdict::Permanent, "{status}");
        }
        for status in [408, 429, 500, 502, 503, 504] {
            assert!(matches!(judge(status, "", None).verdict, AttemptVerdict::Retryable { .. }), "{status}");
        }
        // A webhook delivery answered 202 is simply delivered.
        let hook = super::judge(&response(202, "", None), "http://t.example/h", false, &window);
        assert_eq!(hook.verdict, AttemptVerdict::Succeeded(Value::Null));
    }

    #[test]
    fn a_poll_answer_is_pending_until_the_deadline() {
        let poll =
            PollState { status_url: "http://t.example/s".into(), started_at_ms: 0, deadline_ms: 300_000, seq: 1 };
        let pending = response(202, r#"{"status":"pending"}"#, None);
        assert_eq!(poll_answer(&pending, &poll, 299_999).verdict, AttemptVerdict::Accepted(poll.clone()));
        let late = poll_answer(&pending, &poll, 300_000);
        assert_eq!(late.verdict, AttemptVerdict::Retryable { retry_after: None });
        assert_eq!(late.error.as_deref(), Some("status poll still pending after 300 s"));
        let done = poll_answer(&response(200, r#"{"result":{"ok":true}}"#, None), &poll, 1);
        assert_eq!(done.verdict, AttemptVerdict::Succeeded(json!({"ok": true})));
        let failed = poll_answer(&response(500, "down", None), &poll, 1);
        assert!(matches!(failed.verdict, AttemptVerdict::Retryable { .. }));
        assert_eq!(failed.error.as_deref(), Some("status poll answered HTTP 500: down"));
        assert_eq!(poll_answer(&response(404, "", None), &poll, 1).verdict, AttemptVerdict::Permanent);
    }

    #[test]
    fn excerpts_are_sanitised() {
        assert_eq!(excerpt(b"oops\nbroken"), ": oops broken");
        assert_eq!(excerpt(&[b'x'; 1000]).chars().count(), 2 + 512);
        assert_eq!(excerpt(b"  "), "");
        assert_eq!(excerpt(b"see https://u:p@h.example/x?token=1"), ": see https://h.example/x");
    }
}
