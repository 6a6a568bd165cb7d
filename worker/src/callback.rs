//! One tool-callback attempt: look up the tool, sign the seed's body afresh, POST it, and say what
//! the answer means (following a 202 by polling its status URL).

use std::time::{Duration, Instant};

use serde_json::Value;

use fleet_platform::now_ms;
use fleet_platform::store::Store;
use fleet_protocol::callback::{async_status_url, CallbackBody, REQUEST_ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use fleet_protocol::classify::{classify_status, ResponseClass, TransportFailure};
use fleet_protocol::envelope::Job;
use fleet_protocol::events::WEBHOOK_TIMEOUT_SECS;
use fleet_protocol::secrets::SecretsKey;
use fleet_protocol::signing::signature_header;
use fleet_protocol::timefmt::rfc3339_from_millis;
use tracing::Instrument;

use crate::http::{CallbackClient, ReadResponse};
use crate::registry::Target;

/// What an attempt came to.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptVerdict {
    Succeeded(Value),
    Retryable { retry_after: Option<Duration> },
    Permanent,
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
}

pub struct CallbackContext<'a> {
    pub store: &'a Store,
    pub targets: &'a crate::registry::TargetCache,
    pub callback_timeout: Duration,
    pub client: &'a CallbackClient,
    pub secrets: &'a SecretsKey,
    pub poll_interval: Duration,
    pub poll_limit: Duration,
}

/// A signed request ready to send.
struct Prepared {
    url: String,
    secret: String,
    body: Vec<u8>,
    timestamp: String,
    timeout: Duration,
    /// Tool callbacks may answer 202 and be polled; for a webhook a 202 is simply delivered.
    poll_accepted: bool,
}

/// Runs one attempt of `job` for `execution_id`: a tool callback or a webhook delivery.
pub async fn attempt(ctx: &CallbackContext<'_>, execution_id: &str, job: &Job) -> AttemptReport {
    let prepared = match prepare(ctx, execution_id, job).await {
        Ok(p) => p,
        Err(report) => return report,
    };
    let request = ctx
        .client
        .post(&prepared.url)
        .timeout(prepared.timeout)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(SIGNATURE_HEADER, signature_header(prepared.secret.as_bytes(), &prepared.body))
        .header(TIMESTAMP_HEADER, &prepared.timestamp)
        .header(REQUEST_ID_HEADER, execution_id)
        .body(prepared.body);
    match traced_send(ctx, request, "POST").await {
        Ok(response) => judge(ctx, response, execution_id, prepared.secret.as_bytes(), prepared.poll_accepted).await,
        Err(failure) => AttemptReport::transport(failure),
    }
}

fn registry_unavailable(e: impl std::fmt::Display) -> AttemptReport {
    AttemptReport {
        verdict: AttemptVerdict::Retryable { retry_after: None },
        http_status: None,
        error: Some(format!("registry unavailable: {e}")),
        class: "registry",
    }
}

/// Sends `request` in a client span whose context travels as `traceparent`.
async fn traced_send(
    ctx: &CallbackContext<'_>,
    mut request: reqwest::RequestBuilder,
    method: &'static str,
) -> Result<crate::http::ReadResponse, TransportFailure> {
    let span = tracing::info_span!("http", otel.name = method, otel.kind = "client", http.request.method = method);
    for (name, value) in fleet_platform::telemetry::http_headers(&span) {
        request = request.header(name, value);
    }
    ctx.client.send(request).instrument(span).await
}

/// Looks up the target and its secret, and builds the body signed at this attempt's time.
async fn prepare(ctx: &CallbackContext<'_>, execution_id: &str, job: &Job) -> Result<Prepared, AttemptReport> {
    let timestamp = rfc3339_from_millis(now_ms());
    match job {
        Job::ToolCall(call) => {
            let owner = format!("tool:{}", call.tool_name);
            let target = match ctx.targets.get(&owner) {
                Some(t) => t,
                None => {
                    let tool = match ctx.store.get_tool(&call.tool_name).await {
                        Ok(Some(tool)) => tool,
                        Ok(None) => {
                            return Err(AttemptReport::permanent(format!(
                                "tool {:?} is no longer registered",
                                call.tool_name
                            )))
                        }
                        Err(e) => return Err(registry_unavailable(e)),
                    };
                    let secret = ctx
                        .secrets
                        .decrypt(&owner, &tool.secret_ciphertext)
                        .map_err(|e| AttemptReport::permanent(format!("callback secret cannot be used: {e}")))?;
                    ctx.targets.put(&owner, Target { url: tool.callback_url, secret })
                }
            };
            let body = CallbackBody {
                tool_name: &call.tool_name,
                parameters: &call.parameters,
                execution_id,
                room_id: call.room_id.as_deref(),
                assistant_id: call.assistant_id.as_deref(),
                timestamp: &timestamp,
            }
            .to_bytes();
            Ok(Prepared {
                url: target.url.clone(),
                secret: target.secret.clone(),
                body,
                timestamp,
                timeout: ctx.callback_timeout,
                poll_accepted: true,
            })
        }
        Job::Turn(_) => Err(AttemptReport::permanent("a turn step is not a callback".into())),
        Job::Webhook(hook) => {
            let stored = match ctx.store.get_webhook(&hook.webhook_id).await {
                Ok(Some(h)) => h,
                Ok(None) => {
                    return Err(AttemptReport::permanent(format!(
                        "webhook {:?} is no longer registered",
                        hook.webhook_id
                    )))
                }
                Err(e) => return Err(registry_unavailable(e)),
            };
            let secret = ctx
                .secrets
                .decrypt(&format!("webhook:{}", stored.id), &stored.secret_ciphertext)
                .map_err(|e| AttemptReport::permanent(format!("webhook secret cannot be used: {e}")))?;
            let body = serde_json::to_vec(&hook.payload).expect("a payload serialises");
            Ok(Prepared {
                url: stored.url,
                secret,
                body,
                timestamp,
                timeout: Duration::from_secs(WEBHOOK_TIMEOUT_SECS),
                poll_accepted: false,
            })
        }
    }
}

async fn judge(
    ctx: &CallbackContext<'_>,
    response: ReadResponse,
    execution_id: &str,
    secret: &[u8],
    poll_accepted: bool,
) -> AttemptReport {
    let status = response.status;
    let class = fleet_protocol::classify::status_class(status);
    let report = |verdict, error| AttemptReport { verdict, http_status: Some(status), error, class };
    match classify_status(status, response.retry_after.as_deref(), now_ms() / 1000) {
        ResponseClass::Success => match result_of(&response.body) {
            Ok(result) => report(AttemptVerdict::Succeeded(result), None),
            Err(why) => report(AttemptVerdict::Retryable { retry_after: None }, Some(why)),
        },
        ResponseClass::Accepted if !poll_accepted => report(AttemptVerdict::Succeeded(Value::Null), None),
        ResponseClass::Accepted => {
            let body: Value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
            match async_status_url(&body, response.location.as_deref()) {
                Some(url) => poll(ctx, &url, execution_id, secret).await,
                None => report(
                    AttemptVerdict::Permanent,
                    Some("202 Accepted without a status_url or Location to poll".into()),
                ),
            }
        }
        ResponseClass::Retryable { retry_after } => {
            report(AttemptVerdict::Retryable { retry_after }, Some(format!("HTTP {status}{}", excerpt(&response.body))))
        }
        ResponseClass::Permanent => {
            report(AttemptVerdict::Permanent, Some(format!("HTTP {status}{}", excerpt(&response.body))))
        }
    }
}

/// Polls a 202's status URL (signed GETs) until it answers with a result, a failure, or the limit.
async fn poll(ctx: &CallbackContext<'_>, url: &str, execution_id: &str, secret: &[u8]) -> AttemptReport {
    let deadline = Instant::now() + ctx.poll_limit;
    loop {
        let wait = ctx.poll_interval.min(deadline.saturating_duration_since(Instant::now()));
        tokio::time::sleep(wait).await;
        if Instant::now() >= deadline {
            return AttemptReport::transport(TransportFailure::Timeout(ctx.poll_limit));
        }
        let timestamp = rfc3339_from_millis(now_ms());
        let request = ctx
            .client
            .get(url)
            .header(SIGNATURE_HEADER, signature_header(secret, b""))
            .header(TIMESTAMP_HEADER, &timestamp)
            .header(REQUEST_ID_HEADER, execution_id);
        let response = match traced_send(ctx, request, "GET").await {
            Ok(r) => r,
            Err(failure) => return AttemptReport::transport(failure),
        };
        let status = response.status;
        match classify_status(status, None, 0) {
            ResponseClass::Accepted => continue,
            ResponseClass::Success => {
                let class = fleet_protocol::classify::status_class(status);
                return match result_of(&response.body) {
                    Ok(result) => AttemptReport {
                        verdict: AttemptVerdict::Succeeded(result),
                        http_status: Some(status),
                        error: None,
                        class,
                    },
                    Err(why) => AttemptReport {
                        verdict: AttemptVerdict::Retryable { retry_after: None },
                        http_status: Some(status),
                        error: Some(why),
                        class,
                    },
                };
            }
            _ => {
                return AttemptReport {
                    verdict: match classify_status(status, response.retry_after.as_deref(), now_ms() / 1000) {
                        ResponseClass::Retryable { retry_after } => AttemptVerdict::Retryable { retry_after },
                        _ => AttemptVerdict::Permanent,
                    },
                    http_status: Some(status),
                    error: Some(format!("status poll answered HTTP {status}")),
                    class: fleet_protocol::classify::status_class(status),
                }
            }
        }
    }
}

/// The tool result: `result` of a JSON body; an empty body is a `null` result.
fn result_of(body: &[u8]) -> Result<Value, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    let value: Value = serde_json::from_slice(body).map_err(|_| "success response body is not JSON".to_string())?;
    Ok(match value {
        Value::Object(mut map) if map.contains_key("result") => map.remove("result").unwrap_or(Value::Null),
        other => other,
    })
}

/// A short, single-line excerpt of an error body for the attempt history.
fn excerpt(body: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(body).chars().filter(|c| !c.is_control()).take(200).collect();
    if text.trim().is_empty() {
        String::new()
    } else {
        format!(": {}", text.trim())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_from_the_result_field() {
        assert_eq!(result_of(br#"{"result": {"n": 1}}"#).unwrap(), serde_json::json!({"n": 1}));
        assert_eq!(result_of(br#"{"other": 2}"#).unwrap(), serde_json::json!({"other": 2}));
        assert_eq!(result_of(b"").unwrap(), Value::Null);
        assert!(result_of(b"<html>").is_err());
    }

    #[test]
    fn excerpts_are_short_and_single_line() {
        assert_eq!(excerpt(b"oops\nbroken"), ": oopsbroken");
        assert_eq!(excerpt(&[b'x'; 1000]).len(), 202);
        assert_eq!(excerpt(b"  "), "");
    }
}
