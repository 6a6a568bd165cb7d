//! What happens to one delivery: poison check, hold check, idempotency claim, the attempt, then
//! exactly one of succeed / retry via a delay queue / dead-letter, and only then the ack.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use fleet_platform::dead_letters;
use fleet_platform::telemetry;

use fleet_platform::broker::{BrokerError, Publisher};
use fleet_platform::metrics::Metrics;
use fleet_platform::now_ms;
use fleet_platform::store::{Claim, NewExecution, Store};
use fleet_protocol::deadletter::{excerpt_raw_body, DeadLetterReason, DeadLetterRecord, RECORD_MESSAGE_TYPE};
use fleet_protocol::envelope::{
    is_valid_execution_id, Envelope, Job, JobKind, PoisonReason, PollState, ToolCallJob, WebhookJob, CONTENT_TYPE,
};
use fleet_protocol::events;
use fleet_protocol::execution::{AttemptOutcome, AttemptRecord, ExecutionStatus};
use fleet_protocol::retry::{remaining_hold, RetryDecision};
use fleet_protocol::sanitize::sanitize_error;
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::turn::CallOutcome;
use serde_json::{json, Value};

use crate::callback::{self, AttemptVerdict, CallbackContext};
use crate::http::CallbackClient;
use crate::WorkerConfig;

/// Shared by every job task of a worker.
pub struct Processor {
    pub config: WorkerConfig,
    pub store: Store,
    pub metrics: Metrics,
    pub client: CallbackClient,
    pub llm: crate::llm::LlmClient,
    pub targets: crate::registry::TargetCache,
}

/// How the delivery is settled once the work is done.
pub(crate) enum Settle {
    Ack,
    /// Put back on the queue (a publish we depend on failed; the broker will redeliver).
    Requeue,
}

impl Processor {
    /// Handles one delivery to the end, settling it on `publisher`'s connection.
    pub async fn handle(self: Arc<Self>, delivery: Delivery, publisher: Publisher) {
        let settle = self.process(&delivery, &publisher).await;
        let result = match settle {
            Settle::Ack => delivery.ack(BasicAckOptions::default()).await,
            Settle::Requeue => delivery.nack(BasicNackOptions { requeue: true, ..Default::default() }).await,
        };
        if let Err(e) = result {
            // The channel is gone; the broker returns the message to the queue by itself.
            tracing::warn!(error = %e, "could not settle delivery; it will be redelivered");
        }
    }

    async fn process(&self, delivery: &Delivery, publisher: &Publisher) -> Settle {
        let content_type = delivery.properties.content_type().as_ref().map(|s| s.as_str());
        let envelope = match Envelope::decode(&delivery.data, content_type) {
            Ok(e) => e,
            Err(reason) => return self.dead_letter_poison(delivery, reason, publisher).await,
        };
        let kind = envelope.kind().as_str();
        let queue = self.config.common.topology.work_queue(envelope.kind());
        // The job's span continues the publisher's trace (W3C context from the AMQP headers), and
        // every log line of the job carries its execution id, attempt and tool.
        let span = tracing::info_span!(
            "job",
            otel.name = format!("process {queue}"),
            otel.kind = "consumer",
            messaging.system = "rabbitmq",
            messaging.operation.type = "process",
            messaging.destination.name = %queue,
            messaging.message.id = %envelope.execution_id,
            execution_id = %envelope.execution_id,
            attempt = envelope.attempt,
            kind,
            tool_name = tracing::field::Empty,
            webhook_id = tracing::field::Empty,
            session_id = tracing::field::Empty,
        );
        let _ = span.set_parent(telemetry::from_amqp_headers(delivery.properties.headers().as_ref()));
        match &envelope.job {
            Job::ToolCall(call) => span.record("tool_name", call.tool_name.as_str()),
            Job::Webhook(hook) => span.record("webhook_id", hook.webhook_id.as_str()),
            Job::Turn(step) => span.record("session_id", step.session_id.as_str()),
        };
        async {
            if let Some(remaining) = remaining_hold(envelope.not_before_ms, now_ms()) {
                return self.park(publisher, &envelope, remaining).await;
            }
            let in_flight = self.metrics.jobs_in_flight.with_label_values(&[kind]);
            in_flight.inc();
            let settle = match &envelope.job {
                Job::Turn(step) => self.run_turn_step(publisher, &envelope, step).await,
                _ => self.run_job(publisher, &envelope).await,
            };
            in_flight.dec();
            settle
        }
        .instrument(span)
        .await
    }

    pub(crate) fn finished(&self, envelope: &Envelope, outcome: &str) {
        self.metrics.jobs_finished.with_label_values(&[envelope.kind().as_str(), outcome]).inc();
    }

    async fn run_job(&self, publisher: &Publisher, envelope: &Envelope) -> Settle {
        let id = &envelope.execution_id;
        let lease = self.config.claim_lease;
        let token = match self.store.claim(id, &self.config.worker_id, lease).await {
            Ok(Claim::Acquired { token }) => token,
            Ok(Claim::AlreadyDone { result }) => {
                // A redelivery, duplicate publish or replay of a finished job: nothing runs again.
                self.metrics.idempotency_hits.with_label_values(&[envelope.kind().as_str()]).inc();
                self.finished(envelope, "duplicate");
                // Repair a record left behind when the result was stored but the record was not.
                let repaired = match self.store.get_execution(id).await {
                    Ok(Some(view)) if view.status == ExecutionStatus::Succeeded => Ok(()),
                    Ok(_) => self.store.mark_succeeded(id, &result, now_ms()).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = repaired {
                    tracing::warn!(execution_id = %id, error = %e, "cannot repair the execution record; parked");
                    return self.park(publisher, envelope, self.config.common.retry.delays()[0]).await;
                }
                if let Job::ToolCall(ToolCallJob { parent: Some(parent), tool_name, .. }) = &envelope.job {
                    let outcome = CallOutcome { ok: true, result: result.clone() };
                    self.tool_call_finished(publisher, parent, tool_name, outcome).await;
                }
                tracing::info!(execution_id = %id, "already succeeded; not run again");
                return Settle::Ack;
            }
            Ok(Claim::Busy { remaining }) => {
                tracing::info!(execution_id = %id, remaining_ms = remaining.as_millis() as u64, "claimed by another worker; parked");
                self.finished(envelope, "deferred");
                return self.park(publisher, envelope, remaining).await;
            }
            Err(e) => {
                // Fail closed: no claim, no side effect. Try again later without spending an attempt.
                tracing::warn!(execution_id = %id, error = %e, "cannot claim (Redis unavailable); parked");
                self.finished(envelope, "deferred");
                return self.park(publisher, envelope, self.config.common.retry.delays()[0]).await;
            }
        };
        self.metrics.jobs_started.with_label_values(&[envelope.kind().as_str()]).inc();
        // A poll continues the attempt its POST started.
        let started_ms = envelope.poll.as_ref().map_or_else(now_ms, |p| p.started_at_ms);
        let first_attempt_at_ms = envelope.first_attempt_at_ms.unwrap_or(started_ms);
        // Independent writes: sent together rather than one round trip after the other.
        // Fenced like every record write of the attempt; it also registers this claim's token on
        // the record before the attempt starts, so an older worker can no longer write over it.
        let running =
            self.store.set_status(id, ExecutionStatus::Running, Some(envelope.attempt), started_ms, Some(token));
        let started = async {
            if envelope.attempt == 1 {
                let _ = self.store.mark_started(id, envelope.kind().as_str()).await;
            }
        };
        if let (Ok(false), ()) = tokio::join!(running, started) {
            return self.fenced_off(envelope, token);
        }

        let started = Instant::now();
        let report = {
            let ctx = CallbackContext {
                store: &self.store,
                targets: &self.targets,
                callback_timeout: self.config.callback_timeout,
                client: &self.client,
                secrets: &self.config.secrets_key,
                poll_limit: self.config.async_poll_limit,
            };
            let attempt = callback::attempt(&ctx, id, &envelope.job, envelope.poll.as_ref());
            tokio::pin!(attempt);
            let mut renew = tokio::time::interval(lease / 3);
            renew.tick().await;
            loop {
                tokio::select! {
                    report = &mut attempt => break report,
                    _ = renew.tick() => {
                        if let Ok(false) = self.store.renew(id, token, lease).await {
                            tracing::warn!(execution_id = %id, "lease lost to another worker during the attempt");
                        }
                    }
                }
            }
        };
        let elapsed = started.elapsed();
        self.metrics.attempt_duration.with_label_values(&[envelope.kind().as_str()]).observe(elapsed.as_secs_f64());
        self.metrics.callback_responses.with_label_values(&[envelope.kind().as_str(), report.class]).inc();
        let mut record = AttemptRecord {
            attempt: envelope.attempt,
            started_at: rfc3339_from_millis(started_ms),
            duration_ms: elapsed.as_millis() as u64,
            http_status: report.http_status,
            error: report.error.clone(),
            outcome: AttemptOutcome::Success,
            prompt_tokens: None,
            completion_tokens: None,
        };
        tracing::info!(http_status = report.http_status, error = report.error.as_deref(), "attempt finished");

        let decision = match &report.verdict {
            AttemptVerdict::Succeeded(result) => {
                return match self.store.complete(id, token, result).await {
                    Ok(true) => {
                        let recorded = self
                            .store
                            .record_attempt(
                                id,
                                &record,
                                ExecutionStatus::Succeeded,
                                Some(result),
                                now_ms(),
                                Some(token),
                            )
                            .await;
                        if let Ok(false) = recorded {
                            return self.fenced_off(envelope, token);
                        }
                        if let Err(e) = recorded {
                            // The result is stored; the record is not. The redelivery finds the
                            // result (nothing runs again) and repairs the record.
                            tracing::warn!(execution_id = %id, error = %e, "result stored but not recorded; requeued");
                            return Settle::Requeue;
                        }
                        if let Job::ToolCall(ToolCallJob { parent: Some(parent), tool_name, .. }) = &envelope.job {
                            let outcome = CallOutcome { ok: true, result: result.clone() };
                            self.tool_call_finished(publisher, parent, tool_name, outcome).await;
                        }
                        self.finished(envelope, "success");
                        self.observe_latency(envelope, "success");
                        Settle::Ack
                    }
                    Ok(false) => self.fenced_off(envelope, token),
                    Err(e) => {
                        // The callback ran but its result is not stored: run the attempt again later.
                        tracing::warn!(execution_id = %id, error = %e, "cannot store result; requeued");
                        Settle::Requeue
                    }
                };
            }
            AttemptVerdict::Retryable { retry_after } => {
                self.config.common.retry.after_failure(envelope.attempt, *retry_after)
            }
            AttemptVerdict::Permanent => RetryDecision::Exhausted,
            AttemptVerdict::Accepted(poll) => return self.poll_later(publisher, envelope, token, poll).await,
        };
        let permanent = matches!(report.verdict, AttemptVerdict::Permanent);
        match decision {
            RetryDecision::Retry { next_attempt, wait, step } => {
                record.outcome = AttemptOutcome::Retry;
                let recorded = self
                    .store
                    .record_attempt(id, &record, ExecutionStatus::Retrying, None, now_ms(), Some(token))
                    .await;
                if let Ok(false) = recorded {
                    return self.fenced_off(envelope, token);
                }
                if !self.still_holds(envelope, token, "released").await {
                    return Settle::Ack;
                }
                let next = Envelope {
                    attempt: next_attempt,
                    first_attempt_at_ms: Some(first_attempt_at_ms),
                    not_before_ms: Some(now_ms() + wait.as_millis() as i64),
                    poll: None,
                    ..envelope.clone()
                };
                let queue = self.config.common.topology.delay_queue(envelope.kind(), step);
                match publisher.publish_delayed(&queue, &next, trace_headers()).await {
                    Ok(()) => {
                        self.metrics
                            .retries_scheduled
                            .with_label_values(&[envelope.kind().as_str(), &next_attempt.to_string()])
                            .inc();
                        self.finished(envelope, "retry");
                        Settle::Ack
                    }
                    Err(e) => {
                        tracing::warn!(execution_id = %id, error = %e, "cannot park the retry; requeued");
                        Settle::Requeue
                    }
                }
            }
            RetryDecision::Exhausted => {
                record.outcome = if permanent { AttemptOutcome::Permanent } else { AttemptOutcome::Exhausted };
                // The status says dead_lettered only once the dead letter is durable (below).
                let recorded =
                    self.store.record_attempt(id, &record, ExecutionStatus::Running, None, now_ms(), Some(token)).await;
                if let Ok(false) = recorded {
                    return self.fenced_off(envelope, token);
                }
                if !self.still_holds(envelope, token, "dead_lettered").await {
                    return Settle::Ack;
                }
                let reason = if permanent { DeadLetterReason::Permanent } else { DeadLetterReason::Exhausted };
                let history = match self.store.get_execution(id).await {
                    Ok(Some(view)) => view.attempts,
                    _ => vec![record.clone()],
                };
                let (tool_name, assistant_id, room_id) = match &envelope.job {
                    Job::ToolCall(call) => {
                        (Some(call.tool_name.clone()), call.assistant_id.clone(), call.room_id.clone())
                    }
                    Job::Webhook(_) => (None, None, None),
                    Job::Turn(t) => (None, None, Some(t.session_id.clone())),
                };
                let dead = DeadLetterRecord {
                    execution_id: Some(id.clone()),
                    kind: Some(envelope.kind().as_str().to_string()),
                    tool_name,
                    assistant_id,
                    room_id,
                    attempts: envelope.attempt,
                    last_error: report.error.clone().unwrap_or_else(|| "failed".into()),
                    first_attempt_at: Some(rfc3339_from_millis(first_attempt_at_ms)),
                    last_attempt_at: Some(record.started_at.clone()),
                    reason,
                    dead_lettered_at: rfc3339_from_millis(now_ms()),
                    history,
                    job: serde_json::to_value(Envelope {
                        attempt: 1,
                        not_before_ms: None,
                        poll: None,
                        ..envelope.clone()
                    })
                    .ok(),
                    raw_body: None,
                };
                // Failure events first: their ids derive from this execution, so if anything below
                // fails and the job runs again, the events are still delivered once.
                if matches!(envelope.job, Job::ToolCall(_)) {
                    if let Err(e) = self.emit_failure_events(publisher, &dead).await {
                        tracing::warn!(execution_id = %id, error = %e, "cannot emit failure events; requeued");
                        return Settle::Requeue;
                    }
                }
                let settle = self.publish_dead_letter(publisher, id, &dead, envelope.kind().as_str()).await;
                if matches!(settle, Settle::Ack) {
                    let _ = self.store.set_status(id, ExecutionStatus::DeadLettered, None, now_ms(), Some(token)).await;
                    if let Job::ToolCall(ToolCallJob { parent: Some(parent), tool_name, .. }) = &envelope.job {
                        let error = json!({"error": dead.last_error, "dead_lettered": true});
                        self.tool_call_finished(publisher, parent, tool_name, CallOutcome { ok: false, result: error })
                            .await;
                    }
                    self.finished(envelope, if permanent { "permanent" } else { "dead_letter" });
                    self.observe_latency(envelope, "dead_letter");
                }
                settle
            }
        }
    }

    /// A newer claim fenced this worker off (its write was refused): the newer holder owns the
    /// job, so this delivery is acked with nothing more written or scheduled.
    fn fenced_off(&self, envelope: &Envelope, token: u64) -> Settle {
        tracing::warn!(execution_id = %envelope.execution_id, token, "a newer claim fenced this worker off; its writes are dropped");
        self.finished(envelope, "fenced");
        Settle::Ack
    }

    /// A 202 (or a poll still pending): the attempt goes on in the broker, not in a sleeping task.
    /// The claim is released as `polling` (not done), and the job, carrying the status URL and
    /// deadline, returns after the poll interval to GET the status URL. No attempt is spent.
    async fn poll_later(&self, publisher: &Publisher, envelope: &Envelope, token: u64, poll: &PollState) -> Settle {
        let id = &envelope.execution_id;
        if !self.still_holds(envelope, token, "polling").await {
            return Settle::Ack;
        }
        let interval = self.config.async_poll_interval;
        let next = Envelope {
            first_attempt_at_ms: Some(envelope.first_attempt_at_ms.unwrap_or(poll.started_at_ms)),
            not_before_ms: Some(now_ms() + interval.as_millis() as i64),
            poll: Some(poll.clone()),
            ..envelope.clone()
        };
        let queue =
            self.config.common.topology.delay_queue(envelope.kind(), self.config.common.retry.park_step(interval));
        match publisher.publish_delayed(&queue, &next, trace_headers()).await {
            Ok(()) => {
                self.finished(envelope, "polling");
                Settle::Ack
            }
            Err(e) => {
                tracing::warn!(execution_id = %id, error = %e, "cannot park the status poll; requeued");
                Settle::Requeue
            }
        }
    }

    /// Gives up this worker's claim; `false` means a newer claim fenced it off, so it must not
    /// schedule anything more for the job (the newer holder does).
    async fn still_holds(&self, envelope: &Envelope, token: u64, state: &str) -> bool {
        match self.store.release(&envelope.execution_id, token, state).await {
            Ok(true) => true,
            Ok(false) => {
                self.fenced_off(envelope, token);
                false
            }
            // Redis failed: scheduling the retry anyway loses nothing (the claim's lease expires).
            Err(_) => true,
        }
    }

    pub(crate) fn observe_latency(&self, envelope: &Envelope, outcome: &str) {
        let secs = (now_ms() - envelope.enqueued_at_ms).max(0) as f64 / 1000.0;
        self.metrics.job_latency.with_label_values(&[envelope.kind().as_str(), outcome]).observe(secs);
    }

    /// Holds a job in the delay queue that fits `remaining` without spending an attempt.
    pub(crate) async fn park(&self, publisher: &Publisher, envelope: &Envelope, remaining: Duration) -> Settle {
        let retry = &self.config.common.retry;
        let step = retry.park_step(remaining);
        let held = Envelope { not_before_ms: Some(now_ms() + remaining.as_millis() as i64), ..envelope.clone() };
        let queue = self.config.common.topology.delay_queue(envelope.kind(), step);
        match publisher.publish_delayed(&queue, &held, trace_headers()).await {
            Ok(()) => Settle::Ack,
            Err(e) => {
                tracing::warn!(execution_id = %envelope.execution_id, error = %e, "cannot park job; requeued");
                Settle::Requeue
            }
        }
    }

    async fn dead_letter_poison(&self, delivery: &Delivery, reason: PoisonReason, publisher: &Publisher) -> Settle {
        let message_id = delivery.properties.message_id().as_ref().map(|s| s.to_string());
        let id = message_id.filter(|m| is_valid_execution_id(m)).unwrap_or_else(|| format!("poison_{}", uuid_like()));
        tracing::warn!(dead_letter_id = %id, reason = %reason, "poison message dead-lettered");
        let now = now_ms();
        let record = DeadLetterRecord {
            execution_id: Some(id.clone()),
            kind: None,
            tool_name: None,
            assistant_id: None,
            room_id: None,
            attempts: 0,
            last_error: sanitize_error(&reason.to_string()),
            first_attempt_at: None,
            last_attempt_at: None,
            reason: DeadLetterReason::Poison,
            dead_lettered_at: rfc3339_from_millis(now),
            history: vec![],
            job: None,
            raw_body: Some(excerpt_raw_body(&delivery.data)),
        };
        let settle = self.publish_dead_letter(publisher, &id, &record, "unknown").await;
        if matches!(settle, Settle::Ack) {
            self.metrics.jobs_finished.with_label_values(&["unknown", "poison"]).inc();
        }
        settle
    }

    /// Publishes `tool.callback.failed` and `tool.callback.dead_letter` deliveries (confirmed) to every
    /// subscribed webhook.
    async fn emit_failure_events(&self, publisher: &Publisher, dead: &DeadLetterRecord) -> Result<(), String> {
        let source = dead.execution_id.clone().unwrap_or_default();
        self.notify(publisher, &source, events::TOOL_CALLBACK_FAILED, dead.failed_event_payload()).await?;
        self.notify(publisher, &source, events::TOOL_CALLBACK_DEAD_LETTER, dead.event_payload()).await
    }

    /// Publishes (confirmed) a signed delivery of `payload` to every subscriber of `event`. The
    /// deliveries' ids derive from `source`, so emitting again after a crash delivers once.
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

    /// Makes the dead letter durable; only then may the job be acked. Redis is its store of record;
    /// the dead-letter queue gets a copy too, marked as stored (operators' tap; the dispatcher's
    /// drain acks it). With Redis down, the queue's confirmed copy is what makes it durable, and the
    /// drain stores it once Redis is back.
    pub(crate) async fn publish_dead_letter(
        &self,
        publisher: &Publisher,
        id: &str,
        record: &DeadLetterRecord,
        kind: &str,
    ) -> Settle {
        let stored = match self.store.save_dead_letter(id, record, now_ms()).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(dead_letter_id = %id, error = %e, "dead letter not stored in Redis; queued for the drain");
                false
            }
        };
        let body = serde_json::to_vec(record).expect("a record serialises");
        let mut headers = FieldTable::default();
        headers.insert("x-fleet-dead-letter-reason".into(), long_string(record.reason.as_str()));
        headers.insert(dead_letters::STORED_HEADER.into(), AMQPValue::Boolean(stored));
        let properties = BasicProperties::default()
            .with_content_type(CONTENT_TYPE.into())
            .with_delivery_mode(2)
            .with_message_id(ShortString::from(id))
            .with_type(RECORD_MESSAGE_TYPE.into())
            .with_headers(headers);
        let published: Result<(), BrokerError> =
            publisher.publish(&self.config.common.topology.dead_letter_exchange(), "", &body, properties).await;
        match published {
            Err(e) if !stored => {
                tracing::warn!(dead_letter_id = %id, error = %e, "cannot publish dead letter; requeued");
                return Settle::Requeue;
            }
            Err(e) => tracing::debug!(dead_letter_id = %id, error = %e, "dead letter stored; its queue copy failed"),
            Ok(()) => {}
        }
        self.metrics.dead_letters.with_label_values(&[kind, record.reason.as_str()]).inc();
        Settle::Ack
    }
}

fn long_string(text: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(text.as_bytes().to_vec()))
}

/// AMQP headers carrying the current span's trace context, so a retry continues the trace.
pub(crate) fn trace_headers() -> FieldTable {
    telemetry::amqp_headers(&tracing::Span::current())
}

fn uuid_like() -> String {
    fleet_protocol::new_execution_id().trim_start_matches("exec_").to_string()
}
