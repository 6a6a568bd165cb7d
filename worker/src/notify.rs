//! Signed event deliveries to subscribed webhooks: one webhook job per subscriber, with ids
//! derived from the event's source so emitting again after a crash delivers once. A subscriber's
//! record is created only if absent (a second emission leaves a live delivery as it is), and the
//! deliveries go out with one confirm wait.

use serde_json::Value;

use fleet_platform::broker::Outgoing;
use fleet_platform::now_ms;
use fleet_platform::store::{NewExecution, StoredWebhook};
use fleet_protocol::dead_letters::DeadLetterRecord;
use fleet_protocol::envelope::{Envelope, Job, JobKind, WebhookJob};
use fleet_protocol::events;

use crate::context::Cx;
use crate::publish::trace_headers;

/// Publishes (confirmed) a signed delivery of `payload` to every subscriber of `event` for work
/// that started at `since_ms` (`Cx::subscribers_of`).
pub(crate) async fn notify(
    cx: &Cx<'_>,
    source: &str,
    event: &str,
    payload: Value,
    since_ms: i64,
) -> Result<(), String> {
    let hooks = cx.subscribers_of(event, since_ms).await.map_err(|e| e.to_string())?;
    deliver(cx, &hooks, source, event, payload).await
}

/// Publishes (confirmed) a signed delivery of `payload` to each of `hooks`.
pub(crate) async fn deliver(
    cx: &Cx<'_>,
    hooks: &[StoredWebhook],
    source: &str,
    event: &str,
    payload: Value,
) -> Result<(), String> {
    let ids: Vec<&str> = hooks.iter().map(|h| h.id.as_str()).collect();
    deliver_to(cx, &ids, source, event, |_| payload.clone()).await
}

/// Seed 002's `OUTPUT`: the turn's final message to the output sink its assistant names. The
/// delivery's id is its execution id (`GET /v1/executions/{deliveryId}` shows the receipt), derived
/// from the turn, so a finish carried out again delivers once, under the same `deliveryId`.
pub(crate) async fn deliver_output(cx: &Cx<'_>, turn_id: &str, sink: &str, message: &Value) -> Result<(), String> {
    let payload = |id: &str| fleet_protocol::output_sink::delivery_payload(id, &message["content"], &[]);
    deliver_to(cx, &[sink], turn_id, events::OUTPUT_DELIVERY, payload).await
}

/// Publishes (confirmed) a signed delivery to each webhook of `ids`; `payload` makes its body
/// from the delivery's execution id.
async fn deliver_to(
    cx: &Cx<'_>,
    ids: &[&str],
    source: &str,
    event: &str,
    payload: impl Fn(&str) -> Value,
) -> Result<(), String> {
    if ids.is_empty() {
        return Ok(());
    }
    let topology = &cx.config.common.topology;
    let mut messages = Vec::with_capacity(ids.len());
    for hook in ids {
        let id = fleet_protocol::derived_execution_id(&[source, event, hook]);
        let job =
            Job::Webhook(WebhookJob { webhook_id: hook.to_string(), event: event.to_string(), payload: payload(&id) });
        let envelope = Envelope::new(id.clone(), job, now_ms());
        let record = NewExecution {
            execution_id: &id,
            kind: JobKind::Webhook,
            tool_name: None,
            room_id: None,
            assistant_id: None,
            tenant: None,
            now_ms: now_ms(),
            run_at_ms: None,
        };
        cx.store.executions().create_execution(&record, None).await.map_err(|e| e.to_string())?;
        messages.push(Outgoing::job(
            topology.jobs_exchange(),
            JobKind::Webhook.as_str().into(),
            &envelope,
            trace_headers(),
        ));
    }
    for result in cx.publisher.publish_many(&messages).await {
        result.map_err(|e| e.to_string())?;
        cx.metrics.jobs_published.with_label_values(&[JobKind::Webhook.as_str()]).inc();
    }
    Ok(())
}

/// `tool.callback.failed` and `tool.callback.dead_letter` for a tool call that failed for good.
/// `since_ms`: when the call was enqueued.
pub(crate) async fn emit_failure_events(cx: &Cx<'_>, dead: &DeadLetterRecord, since_ms: i64) -> Result<(), String> {
    let source = dead.execution_id.clone().unwrap_or_default();
    notify(cx, &source, events::TOOL_CALLBACK_FAILED, dead.failed_event_payload(), since_ms).await?;
    notify(cx, &source, events::TOOL_CALLBACK_DEAD_LETTER, dead.event_payload(), since_ms).await
}
