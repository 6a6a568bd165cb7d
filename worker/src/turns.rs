//! Agent turns in the worker: one model step per job. A step takes its session (one turn at a time
//! per session, fleet-wide), calls the model (streaming tokens to the session's event stream), and
//! either finishes the turn or fans its tool calls out as tool-call jobs and suspends; the last tool
//! result to arrive publishes the next step. Nothing holds a worker slot while tools run.

use serde_json::{json, Value};

use fleet_platform::broker::Publisher;
use fleet_platform::now_ms;
use fleet_platform::store::{Claim, NewExecution, SessionFinish, SessionSlot};
use fleet_protocol::deadletter::{DeadLetterReason, DeadLetterRecord};
use fleet_protocol::envelope::{Envelope, Job, JobKind, ToolCallJob, TurnJob, TurnParent};
use fleet_protocol::execution::{AttemptOutcome, AttemptRecord, ExecutionStatus};
use fleet_protocol::history::{self, HistoryEntry};
use fleet_protocol::retry::RetryDecision;
use fleet_protocol::sanitize::sanitize_error;
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::turn::{self, CallOutcome, Message, PendingCall, TurnState};
use fleet_protocol::{derived_execution_id, events};

use crate::llm::{ChatRequest, LlmError};
use crate::process::{trace_headers, Processor, Settle};

impl Processor {
    fn emit(&self, session_id: &str, event: Value) -> impl std::future::Future<Output = ()> + '_ {
        let session_id = session_id.to_string();
        async move {
            if let Err(e) = self.store.publish_event(&session_id, &event).await {
                tracing::warn!(error = %e, "cannot publish a stream event");
            }
        }
    }

    /// One step (model call) of the turn `envelope.execution_id`.
    pub(crate) async fn run_turn_step(&self, publisher: &Publisher, envelope: &Envelope, job: &TurnJob) -> Settle {
        let turn_id = &envelope.execution_id;
        let step_id = derived_execution_id(&[turn_id, "round", &job.round.to_string()]);
        let token = match self.store.claim(&step_id, &self.config.worker_id, self.config.claim_lease).await {
            Ok(Claim::Acquired { token }) => token,
            Ok(Claim::AlreadyDone { .. }) => {
                self.finished(envelope, "duplicate");
                return Settle::Ack;
            }
            Ok(Claim::Busy { remaining }) => return self.park(publisher, envelope, remaining).await,
            Err(_) => return self.park(publisher, envelope, self.config.common.retry.delays()[0]).await,
        };
        let mut state = match self.store.load_turn(turn_id).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                tracing::warn!("turn state missing; dropping the step");
                self.finish_step(&step_id, token).await;
                return Settle::Ack;
            }
            Err(_) => {
                let _ = self.store.release(&step_id, token, "released").await;
                return self.park(publisher, envelope, self.config.common.retry.delays()[0]).await;
            }
        };
        if state.round != job.round {
            // Ran already (a redelivery): make sure the tool calls it fanned out were published.
            if state.round == job.round + 1 {
                self.publish_tool_calls(publisher, turn_id, &state).await;
            }
            self.finish_step(&step_id, token).await;
            return Settle::Ack;
        }
        let session = state.session_id.clone();
        match self.store.session_acquire(&session, turn_id, self.config.session_lease).await {
            Ok(SessionSlot::Acquired) => {}
            Ok(SessionSlot::Wait) => {
                if job.round == 0 && state.behavior == turn::Behavior::Steer {
                    let messages: Vec<String> = state
                        .conversation
                        .iter()
                        .filter(|m| m.role == "user")
                        .filter_map(|m| serde_json::to_string(m).ok())
                        .collect();
                    if let Ok(true) = self.store.session_steer(&session, turn_id, &messages).await {
                        let result = json!({"steered": true});
                        let _ = self.store.mark_succeeded(turn_id, &result, now_ms()).await;
                        self.finish_step(&step_id, token).await;
                        self.finished(envelope, "success");
                        return Settle::Ack;
                    }
                }
                let _ = self.store.release(&step_id, token, "released").await;
                return self.park(publisher, envelope, self.config.common.retry.delays()[0]).await;
            }
            Err(_) => {
                let _ = self.store.release(&step_id, token, "released").await;
                return self.park(publisher, envelope, self.config.common.retry.delays()[0]).await;
            }
        }
        if job.round == 0 && envelope.attempt == 1 {
            let _ = self.store.mark_started(turn_id, JobKind::Turn.as_str()).await;
        }
        if job.round == 0 {
            // Read under the session's lock, so the previous turn's exchange is in it.
            match self.store.history(&session).await {
                Ok(history) => state.insert_history(history.iter().map(HistoryEntry::to_message).collect()),
                Err(_) => {
                    let _ = self.store.release(&step_id, token, "released").await;
                    return self.park(publisher, envelope, self.config.common.retry.delays()[0]).await;
                }
            }
        }
        if job.round > 0 && !state.pending.is_empty() {
            let outcomes = self.store.call_outcomes(turn_id).await.unwrap_or_default();
            for call in std::mem::take(&mut state.pending) {
                let outcome = outcomes
                    .get(&call.call_id)
                    .cloned()
                    .unwrap_or(CallOutcome { ok: false, result: json!({"error": "no result"}) });
                let content = turn::tool_message_content(&outcome, self.config.tool_result_max_bytes);
                state.conversation.push(Message {
                    role: "tool".into(),
                    content: Some(content),
                    tool_calls: vec![],
                    tool_call_id: Some(call.call_id),
                });
            }
        }
        for raw in self.store.session_take_steer(&session).await.unwrap_or_default() {
            if let Ok(m) = serde_json::from_str::<Message>(&raw) {
                state.conversation.push(m);
            }
        }
        let _ = self.store.set_status(turn_id, ExecutionStatus::Running, Some(envelope.attempt), now_ms(), None).await;
        if state.round >= self.config.max_rounds {
            let error = format!("the turn took more than {} model rounds", self.config.max_rounds);
            return self.fail_turn(publisher, envelope, &mut state, &step_id, token, "max_rounds", &error, None).await;
        }

        let started = std::time::Instant::now();
        let model = state.assistant.model_config.model.clone();
        let tools = self.tool_specs(&state).await;
        let request = ChatRequest {
            model: &model,
            temperature: state.assistant.model_config.temperature,
            max_tokens: state.assistant.model_config.max_tokens.unwrap_or(self.config.llm_max_tokens),
            messages: state.conversation.iter().map(Message::to_openai).collect(),
            tools,
        };
        let mut index = 0u64;
        // Every attempt streams under its own message id: a retried attempt's tokens are never
        // mixed with the next one's (the client is told to drop them with a `retry` event).
        state.message_id = turn::attempt_message_id(turn_id, job.round, envelope.attempt);
        let message_id = state.message_id.clone();
        let span = tracing::info_span!("llm", otel.name = "chat.completions", otel.kind = "client", gen_ai.request.model = %model);
        let traceparent = fleet_platform::telemetry::http_headers(&span);
        let result = {
            use tracing::Instrument;
            self.llm
                .complete(request, traceparent, |token| {
                    let event = turn::token_event(&token, index, &message_id);
                    index += 1;
                    self.emit(&session, event)
                })
                .instrument(span)
                .await
        };
        let elapsed = started.elapsed();
        self.metrics.llm_request_duration.with_label_values(&[&model]).observe(elapsed.as_secs_f64());
        log_model_attempt(envelope.attempt, elapsed, &result);
        let attempt = |error: Option<String>, status: Option<u16>, outcome| AttemptRecord {
            attempt: envelope.attempt,
            started_at: rfc3339_from_millis(now_ms() - elapsed.as_millis() as i64),
            duration_ms: elapsed.as_millis() as u64,
            http_status: status,
            error: error.as_deref().map(sanitize_error),
            outcome,
            prompt_tokens: result.as_ref().ok().and_then(|c| c.prompt_tokens),
            completion_tokens: result.as_ref().ok().and_then(|c| c.completion_tokens),
        };
        let completion = match result.clone() {
            Ok(c) => c,
            Err(LlmError::Retryable { status, retry_after, message }) => {
                let _ = self.store.release(&step_id, token, "released").await;
                return match self.config.common.retry.after_failure(envelope.attempt, retry_after) {
                    RetryDecision::Retry { next_attempt, wait, step } => {
                        self.emit(&session, turn::retry_event(&message_id, envelope.attempt, &message)).await;
                        let _ = self
                            .store
                            .record_attempt(
                                turn_id,
                                &attempt(Some(message), status, AttemptOutcome::Retry),
                                ExecutionStatus::Retrying,
                                None,
                                now_ms(),
                                None,
                            )
                            .await;
                        let next = Envelope {
                            attempt: next_attempt,
                            not_before_ms: Some(now_ms() + wait.as_millis() as i64),
                            ..envelope.clone()
                        };
                        let queue = self.config.common.topology.delay_queue(JobKind::Turn, step);
                        match publisher.publish_delayed(&queue, &next, trace_headers()).await {
                            Ok(()) => {
                                self.finished(envelope, "retry");
                                Settle::Ack
                            }
                            Err(_) => Settle::Requeue,
                        }
                    }
                    RetryDecision::Exhausted => {
                        let token =
                            match self.store.claim(&step_id, &self.config.worker_id, self.config.claim_lease).await {
                                Ok(Claim::Acquired { token }) => token,
                                _ => return Settle::Ack,
                            };
                        let _ = self
                            .store
                            .record_attempt(
                                turn_id,
                                &attempt(Some(message.clone()), status, AttemptOutcome::Exhausted),
                                ExecutionStatus::Running,
                                None,
                                now_ms(),
                                None,
                            )
                            .await;
                        self.fail_turn(
                            publisher,
                            envelope,
                            &mut state,
                            &step_id,
                            token,
                            "llm_unavailable",
                            &message,
                            Some(DeadLetterReason::Exhausted),
                        )
                        .await
                    }
                };
            }
            Err(e @ LlmError::Permanent { .. }) => {
                let _ = self
                    .store
                    .record_attempt(
                        turn_id,
                        &attempt(Some(e.message().to_string()), e.status(), AttemptOutcome::Permanent),
                        ExecutionStatus::Running,
                        None,
                        now_ms(),
                        None,
                    )
                    .await;
                return self
                    .fail_turn(
                        publisher,
                        envelope,
                        &mut state,
                        &step_id,
                        token,
                        "llm_error",
                        e.message(),
                        Some(DeadLetterReason::Permanent),
                    )
                    .await;
            }
        };
        state.usage.prompt_tokens += completion.prompt_tokens.unwrap_or(0);
        state.usage.completion_tokens += completion.completion_tokens.unwrap_or(0);
        for (kind, n) in [("prompt", completion.prompt_tokens), ("completion", completion.completion_tokens)] {
            if let Some(n) = n {
                self.metrics.llm_tokens.with_label_values(&[&model, kind]).inc_by(n);
            }
        }
        let _ = self
            .store
            .record_attempt(
                turn_id,
                &attempt(None, Some(200), AttemptOutcome::Success),
                ExecutionStatus::Running,
                None,
                now_ms(),
                None,
            )
            .await;

        if completion.tool_calls.is_empty() {
            return self.finish_turn(publisher, envelope, &mut state, &step_id, token, completion).await;
        }
        // Tool calls: record them, answer refused ones at once, fan the rest out, suspend.
        state.conversation.push(Message {
            role: "assistant".into(),
            content: (!completion.content.is_empty()).then(|| completion.content.clone()),
            tool_calls: completion.tool_calls.clone(),
            tool_call_id: None,
        });
        let mut pending = Vec::new();
        let mut refused = Vec::new();
        for call in &completion.tool_calls {
            let parameters = turn::parse_arguments(&call.arguments);
            self.emit(
                &session,
                turn::tool_call_event(call, parameters.as_ref().unwrap_or(&Value::Null), &state.message_id),
            )
            .await;
            let exec = derived_execution_id(&[turn_id, &job.round.to_string(), &call.id]);
            let planned = PendingCall {
                call_id: call.id.clone(),
                tool_name: call.name.clone(),
                execution_id: Some(exec.clone()),
            };
            let problem = if !state.enabled(&call.name) {
                Some(("tool_not_allowed", format!("tool {:?} is not enabled for this assistant", call.name)))
            } else {
                match &parameters {
                    Err(e) => Some(("tool_not_allowed", e.clone())),
                    Ok(arguments) => match crate::arguments::schema_problem(&self.store, &call.name, arguments).await {
                        Some(e) => Some(("invalid_arguments", e)),
                        // Published, it would be poison to every worker and the turn would wait forever.
                        None => tool_call_envelope(&state, turn_id, &planned, &exec, arguments.clone(), job.round)
                            .check_publishable_size()
                            .err()
                            .map(|size| ("tool_arguments_too_large", too_large_message(size))),
                    },
                }
            };
            match problem {
                Some((code, error)) => {
                    refused.push((call.id.clone(), code, error));
                    pending.push(PendingCall {
                        call_id: call.id.clone(),
                        tool_name: call.name.clone(),
                        execution_id: None,
                    });
                }
                None => pending.push(planned),
            }
        }
        for (call_id, code, error) in &refused {
            let _ = self
                .store
                .record_call_outcome(turn_id, call_id, &CallOutcome { ok: false, result: json!(error) })
                .await;
            self.emit(&session, turn::error_event(code, error, Some(call_id), &state.message_id)).await;
        }
        state.tool_calls.extend(pending.iter().cloned());
        state.pending = pending;
        state.round += 1;
        let arguments: std::collections::HashMap<String, Value> = completion
            .tool_calls
            .iter()
            .filter_map(|c| turn::parse_arguments(&c.arguments).ok().map(|a| (c.id.clone(), a)))
            .collect();
        if self.store.save_turn(turn_id, &state).await.is_err() {
            let _ = self.store.release(&step_id, token, "released").await;
            return Settle::Requeue;
        }
        // Arguments travel in the jobs; stash them in the state-independent order of the calls.
        self.publish_tool_calls_with(publisher, turn_id, &state, &arguments).await;
        if state.pending.iter().all(|p| p.execution_id.is_none()) {
            self.continue_turn(publisher, turn_id, &state).await;
        }
        self.finish_step(&step_id, token).await;
        self.finished(envelope, "success");
        Settle::Ack
    }

    /// Marks a step as run, so a redelivered copy does not run it again.
    async fn finish_step(&self, step_id: &str, token: u64) {
        let _ = self.store.complete(step_id, token, &json!({"step": "done"})).await;
    }

    /// The registered, enabled tools as OpenAI function specs.
    async fn tool_specs(&self, state: &TurnState) -> Vec<Value> {
        let mut specs = Vec::new();
        for name in &state.assistant.enabled_tools {
            if let Ok(Some(tool)) = self.store.get_tool(name).await {
                specs.push(json!({"type": "function", "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters}}));
            }
        }
        specs
    }

    /// Republishes the tool calls a step fanned out (idempotent: their ids are derived), taking
    /// their arguments from the conversation.
    async fn publish_tool_calls(&self, publisher: &Publisher, turn_id: &str, state: &TurnState) {
        let arguments: std::collections::HashMap<String, Value> = state
            .conversation
            .iter()
            .rev()
            .find(|m| !m.tool_calls.is_empty())
            .map(|m| {
                m.tool_calls
                    .iter()
                    .filter_map(|c| turn::parse_arguments(&c.arguments).ok().map(|a| (c.id.clone(), a)))
                    .collect()
            })
            .unwrap_or_default();
        self.publish_tool_calls_with(publisher, turn_id, state, &arguments).await;
    }

    async fn publish_tool_calls_with(
        &self,
        publisher: &Publisher,
        turn_id: &str,
        state: &TurnState,
        arguments: &std::collections::HashMap<String, Value>,
    ) {
        let done = self.store.call_outcomes(turn_id).await.unwrap_or_default();
        for call in state.pending.iter().filter(|c| !done.contains_key(&c.call_id)) {
            let Some(exec) = &call.execution_id else { continue };
            let parameters = arguments.get(&call.call_id).cloned().unwrap_or_else(|| json!({}));
            let envelope = tool_call_envelope(state, turn_id, call, exec, parameters, state.round - 1);
            let _ = self
                .store
                .create_execution(&NewExecution {
                    execution_id: exec,
                    kind: JobKind::ToolCall.as_str(),
                    tool_name: Some(&call.tool_name),
                    room_id: Some(&state.session_id),
                    assistant_id: Some(&state.assistant.id),
                    now_ms: now_ms(),
                })
                .await;
            if let Err(e) = publisher.publish_job(&self.config.common.topology, &envelope, trace_headers()).await {
                tracing::warn!(error = %e, "cannot publish a tool call; the step's redelivery publishes it");
            } else {
                self.metrics.jobs_published.with_label_values(&[JobKind::ToolCall.as_str()]).inc();
            }
        }
    }

    /// Publishes the turn's next step.
    async fn continue_turn(&self, publisher: &Publisher, turn_id: &str, state: &TurnState) {
        let next = Envelope::new(
            turn_id.to_string(),
            Job::Turn(TurnJob { session_id: state.session_id.clone(), round: state.round }),
            now_ms(),
        );
        if let Err(e) = publisher.publish_job(&self.config.common.topology, &next, trace_headers()).await {
            tracing::warn!(error = %e, "cannot publish the turn's next step");
        }
    }

    /// Called when a tool call made by a turn ends (result or final error): records the outcome,
    /// streams it, and if it was the last one owed, publishes the turn's next step.
    pub(crate) async fn tool_call_finished(
        &self,
        publisher: &Publisher,
        parent: &TurnParent,
        tool_name: &str,
        outcome: CallOutcome,
    ) {
        let outcomes = match self.store.record_call_outcome(&parent.turn_execution_id, &parent.call_id, &outcome).await
        {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "cannot record a tool result for its turn");
                return;
            }
        };
        let Ok(Some(state)) = self.store.load_turn(&parent.turn_execution_id).await else { return };
        let event = if outcome.ok {
            turn::tool_result_event(&parent.call_id, tool_name, &outcome, &state.message_id)
        } else {
            turn::error_event(
                "tool_callback_failed",
                &outcome.result.to_string(),
                Some(&parent.call_id),
                &state.message_id,
            )
        };
        self.emit(&state.session_id, event).await;
        if state.round == parent.round + 1 && state.pending.iter().all(|p| outcomes.contains_key(&p.call_id)) {
            self.continue_turn(publisher, &parent.turn_execution_id, &state).await;
        }
    }

    async fn finish_turn(
        &self,
        publisher: &Publisher,
        envelope: &Envelope,
        state: &mut TurnState,
        step_id: &str,
        token: u64,
        completion: turn::Completion,
    ) -> Settle {
        let turn_id = &envelope.execution_id;
        let content = completion.content;
        let mut message = json!({
            "id": state.message_id,
            "role": "assistant",
            "content": content,
            "tool_calls": [],
            "created_at": rfc3339_from_millis(now_ms()),
        });
        // `length`: the answer was cut at max_tokens, and the client must be able to tell.
        if let Some(reason) = completion.finish_reason {
            message["finish_reason"] = json!(reason);
        }
        state.conversation.push(Message::text("assistant", &content));
        state.round += 1;
        self.remember(turn_id, state).await;
        match self.store.session_finish(&state.session_id, turn_id).await {
            Ok(SessionFinish::SteerPending) => {
                // A steer arrived while the model answered: the turn goes on with it.
                let _ = self.store.save_turn(turn_id, state).await;
                self.continue_turn(publisher, turn_id, state).await;
                let _ = self.store.complete(step_id, token, &json!({"step": "done"})).await;
                return Settle::Ack;
            }
            Ok(SessionFinish::Released { next }) => {
                if let Some(next) = next {
                    self.wake(publisher, &next, &state.session_id).await;
                }
            }
            Ok(SessionFinish::NotHolder) => tracing::warn!("the session lock expired during the turn"),
            Err(e) => tracing::warn!(error = %e, "cannot release the session"),
        }
        state.final_message = Some(message.clone());
        let _ = self.store.save_turn(turn_id, state).await;
        self.emit(&state.session_id, turn::message_complete_event(&message)).await;
        self.emit(&state.session_id, turn::done_event(&state.message_id)).await;
        let result = json!({"message": message});
        let _ = self.store.mark_succeeded(turn_id, &result, now_ms()).await;
        let payload = json!({"event": events::AGENT_ROOM_MESSAGE, "data": {"room_id": state.session_id, "assistant_id": state.assistant.id, "execution_id": turn_id, "message": message}});
        if let Err(e) = self.notify(publisher, turn_id, events::AGENT_ROOM_MESSAGE, payload).await {
            tracing::warn!(error = %e, "cannot publish the agent.room.message deliveries");
        }
        let _ = self.store.complete(step_id, token, &json!({"step": "done"})).await;
        self.finished(envelope, "success");
        self.observe_latency(envelope, "success");
        Settle::Ack
    }

    #[allow(clippy::too_many_arguments)]
    async fn fail_turn(
        &self,
        publisher: &Publisher,
        envelope: &Envelope,
        state: &mut TurnState,
        step_id: &str,
        token: u64,
        code: &str,
        error: &str,
        reason: Option<DeadLetterReason>,
    ) -> Settle {
        let turn_id = &envelope.execution_id;
        self.emit(&state.session_id, turn::error_event(code, error, None, &state.message_id)).await;
        self.emit(&state.session_id, turn::done_event(&state.message_id)).await;
        let history = self.store.get_execution(turn_id).await.ok().flatten().map(|v| v.attempts).unwrap_or_default();
        let record = DeadLetterRecord {
            execution_id: Some(turn_id.clone()),
            kind: Some(JobKind::Turn.as_str().into()),
            tool_name: None,
            assistant_id: Some(state.assistant.id.clone()),
            room_id: Some(state.session_id.clone()),
            attempts: envelope.attempt,
            last_error: sanitize_error(error),
            first_attempt_at: history.first().map(|a| a.started_at.clone()),
            last_attempt_at: history.last().map(|a| a.started_at.clone()),
            reason: reason.unwrap_or(DeadLetterReason::Permanent),
            dead_lettered_at: rfc3339_from_millis(now_ms()),
            history,
            job: serde_json::to_value(Envelope { attempt: 1, not_before_ms: None, ..envelope.clone() }).ok(),
            raw_body: None,
        };
        let settle = self.publish_dead_letter(publisher, turn_id, &record, JobKind::Turn.as_str()).await;
        if !matches!(settle, Settle::Ack) {
            return settle;
        }
        let _ = self.store.set_status(turn_id, ExecutionStatus::DeadLettered, None, now_ms(), None).await;
        if let Ok(SessionFinish::Released { next: Some(next) }) =
            self.store.session_finish(&state.session_id, turn_id).await
        {
            self.wake(publisher, &next, &state.session_id).await;
        }
        let _ = self.store.complete(step_id, token, &json!({"step": "failed"})).await;
        self.finished(envelope, "dead_letter");
        Settle::Ack
    }

    /// Appends what the turn said since its last append to the session's history, while it still
    /// holds the session, so the next turn reads it. Once per (turn, round): a finish run twice
    /// appends once.
    async fn remember(&self, turn_id: &str, state: &mut TurnState) {
        let (first, own) = state.unremembered();
        let created_at = rfc3339_from_millis(now_ms());
        let entries = history::exchange_entries(turn_id, first, own, &state.message_id, &created_at);
        let append_id = format!("{turn_id}:{}", state.round);
        let (max_messages, max_bytes) = (self.config.history_max_messages, self.config.history_max_bytes);
        match self.store.history_append(&state.session_id, &append_id, &entries, max_messages, max_bytes).await {
            Ok(()) => state.remembered = first + entries.len(),
            Err(e) => tracing::warn!(error = %e, "cannot append the turn to its session's history"),
        }
    }

    /// Nudges the next turn in a session's line (its own parked job would also come back).
    async fn wake(&self, publisher: &Publisher, next: &str, session_id: &str) {
        let envelope = Envelope::new(
            next.to_string(),
            Job::Turn(TurnJob { session_id: session_id.to_string(), round: 0 }),
            now_ms(),
        );
        let _ = publisher.publish_job(&self.config.common.topology, &envelope, trace_headers()).await;
    }
}

/// The job that runs `call` (made in the turn's `round`) as execution `exec`.
fn tool_call_envelope(
    state: &TurnState,
    turn_id: &str,
    call: &PendingCall,
    exec: &str,
    parameters: Value,
    round: u32,
) -> Envelope {
    let job = Job::ToolCall(ToolCallJob {
        tool_name: call.tool_name.clone(),
        parameters,
        room_id: Some(state.session_id.clone()),
        assistant_id: Some(state.assistant.id.clone()),
        parent: Some(TurnParent { turn_execution_id: turn_id.to_string(), call_id: call.call_id.clone(), round }),
    });
    Envelope::new(exec.to_string(), job, now_ms())
}

/// What the model is told about a call whose job would be `size` bytes (its arguments are not echoed).
fn too_large_message(size: usize) -> String {
    use fleet_protocol::envelope::{ENVELOPE_HEADROOM_BYTES, MAX_ENVELOPE_BYTES};
    format!(
        "the call's arguments make a job of {size} bytes, over the limit of {} bytes; call the tool with smaller arguments",
        MAX_ENVELOPE_BYTES - ENVELOPE_HEADROOM_BYTES
    )
}

/// Every model attempt leaves a log line, like a callback attempt: duration, outcome, tokens.
fn log_model_attempt(attempt: u32, elapsed: std::time::Duration, result: &Result<turn::Completion, LlmError>) {
    let duration_ms = elapsed.as_millis() as u64;
    match result {
        Ok(c) => tracing::info!(
            attempt,
            duration_ms,
            finish_reason = c.finish_reason.as_deref(),
            prompt_tokens = c.prompt_tokens,
            completion_tokens = c.completion_tokens,
            "model attempt finished"
        ),
        Err(e) => {
            tracing::warn!(attempt, duration_ms, http_status = e.status(), error = e.message(), "model attempt failed")
        }
    }
}
