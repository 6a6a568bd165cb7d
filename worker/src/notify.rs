//! Signed event deliveries to subscribed webhooks: one webhook job per subscriber, with ids
//! derived from the event's source so emitting again after a crash delivers once.

use serde_json::Value;

use fleet_platform::broker::Publisher;
use fleet_platform::now_ms;
use fleet_platform::store::NewExecution;
use fleet_protocol::deadletter::DeadLetterRecord;
use fleet_protocol::envelope::{Envelope, Job, JobKind, WebhookJob};
use fleet_protocol::events;

use crate::process::Processor;
use crate::settle::trace_headers;

impl Processor {
    /// Publishes (confirmed) a signed delivery of `payload` to every subscriber of `event`.
    pub(crate) async fn notify(
        &self,
        publisher: &Publisher,
        source: &str,
        event: &str,
        payload: Value,
    ) -> Result<(), String> {
        for hook in self.store.subscribers(event).await.map_err(|e| e.to_string())? {
            let id = fleet_protocol::derived_execution_id(&[source, event, &hook.id]);
            let job = Job::Webhook(WebhookJob {
                webhook_id: hook.id.clone(),
                event: event.to_string(),
                payload: payload.clone(),
            });
            let envelope = Envelope::new(id.clone(), job, now_ms());
            let _ = self
                .store
                .create_execution(&NewExecution {
                    execution_id: &id,
                    kind: JobKind::Webhook.as_str(),
                    tool_name: None,
                    room_id: None,
                    assistant_id: None,
                    now_ms: now_ms(),
                    run_at_ms: None,
                })
                .await;
            publisher
                .publish_job(&self.config.common.topology, &envelope, trace_headers())
                .await
                .map_err(|e| e.to_string())?;
            self.metrics.jobs_published.with_label_values(&[JobKind::Webhook.as_str()]).inc();
        }
        Ok(())
    }

    /// `tool.callback.failed` and `tool.callback.dead_letter` for a tool call that failed for good.
    pub(crate) async fn emit_failure_events(
        &self,
        publisher: &Publisher,
        dead: &DeadLetterRecord,
    ) -> Result<(), String> {
        let source = dead.execution_id.clone().unwrap_or_default();
        self.notify(publisher, &source, events::TOOL_CALLBACK_FAILED, dead.failed_event_payload()).await?;
        self.notify(publisher, &source, events::TOOL_CALLBACK_DEAD_LETTER, dead.event_payload()).await
    }
}
