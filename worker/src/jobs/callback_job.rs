//! The life of a callback job (a tool call or a webhook delivery), top to bottom: the tool's
//! circuit, the claim (which also marks the record running, unless the tool's limits must pass
//! first), the limits, one signed POST (or a status poll) with the claim renewed, the endpoint's
//! signal, then the outcome. A tool call made by a turn tells its turn when it succeeds.

use std::time::Instant;

use serde_json::Value;

use fleet_platform::now_ms;
use fleet_platform::store::{Begin, ClaimAfter, Fence, Transition};
use fleet_protocol::envelope::{Envelope, Job};
use fleet_protocol::execution::{field, AttemptOutcome, AttemptRecord, ExecutionStatus};
use fleet_protocol::life::Owed;
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::tools::ToolExecution;
use fleet_protocol::turn::CallOutcome;

use super::claim::{self, Claim, Mode};
use super::parent::{self, Parent};
use super::{approval, circuit, limits};
use crate::callback::{self, AttemptReport, AttemptVerdict, CallbackContext};
use crate::context::{Cx, KnownTool};
use crate::outcome::{Failure, Finished, HeldClaim, Outcome};
use crate::publish::retrying_redis;

pub(super) async fn run(cx: &Cx<'_>, envelope: &Envelope, parent: Option<Parent<'_>>) -> Outcome {
    pipeline(cx, envelope, parent.as_ref()).await.unwrap_or_else(|stop| stop)
}

async fn pipeline(cx: &Cx<'_>, envelope: &Envelope, parent: Option<&Parent<'_>>) -> Result<Outcome, Outcome> {
    let gate = circuit::admit(cx, envelope).await?;
    let limited = limits::applies(cx, envelope).await;
    if let Some(parent) = parent {
        follow_a_cancelled_turn(cx, envelope, parent).await;
    }
    let mode = if limited { Mode::Hold } else { Mode::Run };
    let held = match claim::admit(cx, envelope, mode).await? {
        Claim::Step { held, .. } => held,
        Claim::Owed { owed, result } => return Err(Outcome::Owed(owed, result)),
        Claim::Cancelled => return Ok(parent::cancelled(cx, envelope, parent).await),
    };
    // A call waiting for an operator runs only as its approval's decision (or deadline) allows.
    if let Some(release) = approval::gate(cx, envelope, parent, held).await? {
        let session = parent.and_then(|p| p.session_id).unwrap_or_default();
        return Ok(approval::hand_to_client(cx, envelope, session, held, &release).await);
    }
    // Over its tool's limits a call gives its claim back and is parked: nothing sent or spent.
    let admission = limits::admit(cx, envelope, held).await?;
    if mode == Mode::Hold {
        if let Err(stop) = begin(cx, envelope, parent, held).await {
            limits::release(cx, admission).await;
            return Err(stop);
        }
    }
    // A poll continues the attempt its POST started.
    let started_ms = envelope.poll.as_ref().map_or_else(now_ms, |poll| poll.started_at_ms);
    let kind = envelope.kind().as_str();
    cx.metrics.jobs_started.with_label_values(&[kind]).inc();
    let clock = Instant::now();
    let runner = runner(cx, envelope).await;
    let report = attempt(cx, envelope, held, &admission, runner.as_deref()).await;
    limits::release(cx, admission).await;
    let record = attempt_record(cx, envelope, &report, started_ms, clock);
    circuit::after_attempt(cx, envelope, gate, &report, &record, held).await?;
    Ok(match report.verdict {
        AttemptVerdict::Succeeded(result) => {
            let outcome = CallOutcome { ok: true, result, external: None };
            succeed(cx, envelope, parent, held, &record, outcome).await
        }
        AttemptVerdict::Structured(result) => {
            let mut record = record;
            if !result.is_success() {
                record.outcome = AttemptOutcome::Permanent;
            }
            succeed(cx, envelope, parent, held, &record, CallOutcome::structured(*result)).await
        }
        AttemptVerdict::Retryable { retry_after } => failed(&report, record, held, started_ms, retry_after, false),
        AttemptVerdict::Permanent => failed(&report, record, held, started_ms, None, true),
        AttemptVerdict::Accepted(poll) => Outcome::Poll(Box::new(poll), held),
    })
}

/// A turn's call whose turn was cancelled is cancelled too, before its claim: the claim then finds
/// it cancelled and tells the turn (a call already being sent is not unsent).
async fn follow_a_cancelled_turn(cx: &Cx<'_>, envelope: &Envelope, parent: &Parent<'_>) {
    if let Ok(true) = cx.store.executions().cancel_requested(&parent.turn.turn_execution_id).await {
        let _ = cx.store.executions().request_cancel(&envelope.execution_id, now_ms()).await;
    }
}

/// The `running` write of a call whose claim only held the record while its limits were checked:
/// it loses to a cancel that came first.
async fn begin(cx: &Cx<'_>, envelope: &Envelope, parent: Option<&Parent<'_>>, held: HeldClaim) -> Result<(), Outcome> {
    match cx.store.executions().begin_attempt(&envelope.execution_id, held.token, envelope.attempt).await {
        Ok(Begin::Started) => Ok(()),
        Ok(Begin::Fenced) => Err(Outcome::Fenced),
        Ok(Begin::Cancelled) => Err(parent::cancelled(cx, envelope, parent).await),
        Err(e) => {
            tracing::warn!(error = %e, "cannot record the attempt's start; parked");
            Err(claim::release_and_park(cx, envelope, held, cx.soon()).await)
        }
    }
}

/// The tool of a call that runs other than as a signed POST: an MCP server's or a data source's
/// (read from the worker's cache).
async fn runner(cx: &Cx<'_>, envelope: &Envelope) -> Option<std::sync::Arc<KnownTool>> {
    let Job::ToolCall(call) = &envelope.job else { return None };
    let tool = cx.tool(&call.tool_name).await.ok().flatten()?;
    match &tool.stored.execution {
        ToolExecution::Mcp(_) | ToolExecution::DataSource(_) => Some(tool),
        ToolExecution::Callback | ToolExecution::Client => None,
    }
}

/// The attempt itself, its claim and its tool's concurrency slot renewed while it runs: a signed
/// POST, or, for an MCP server's tool, a `tools/call` (`mcp_call.rs`), or, for a data source's, a
/// read-only query (`data_source_call.rs`).
async fn attempt(
    cx: &Cx<'_>,
    envelope: &Envelope,
    held: HeldClaim,
    admission: &limits::ToolAdmission,
    runner: Option<&KnownTool>,
) -> AttemptReport {
    let ctx = CallbackContext {
        store: cx.store,
        mcp: cx.mcp,
        mcp_servers: cx.mcp_servers,
        data_source_networks: &cx.config.data_source_networks,
        data_source_entries: cx.data_source_entries,
        tools: cx.tools,
        targets: cx.targets,
        callback_timeout: cx.config.callback_timeout,
        client: cx.client,
        secrets: &cx.config.secrets_key,
        poll_limit: cx.config.async_poll_limit,
        redactor: &cx.config.redactor,
    };
    // Pinned here and lent to the renewals around it: a future they took by value would be laid out
    // again in each of their futures (the compiler does not overlap an awaited argument with the
    // future awaiting it), and the attempt is the largest part of a callback job.
    let sent = std::pin::pin!(async {
        match (runner.map(|known| (known, &known.stored.execution)), &envelope.job) {
            (Some((known, ToolExecution::Mcp(tool))), Job::ToolCall(call)) => {
                let output = known.output_schema();
                crate::mcp_call::attempt(&ctx, cx.mcp, &envelope.execution_id, call, (tool, output)).await
            }
            (Some((_, ToolExecution::DataSource(source))), Job::ToolCall(call)) => {
                let job = crate::data_source_call::SourceJob {
                    execution_id: &envelope.execution_id,
                    since_ms: envelope.enqueued_at_ms,
                    call,
                };
                crate::data_source_call::attempt(&ctx, cx.data_sources, job, source).await
            }
            _ => callback::attempt(&ctx, &envelope.execution_id, &envelope.job, envelope.poll.as_ref()).await,
        }
    });
    let sent = std::pin::pin!(limits::holding(cx, admission, sent));
    let report = claim::renewing(cx, &envelope.execution_id, held, false, sent).await;
    report.expect("callbacks are not stopped by a lost lease")
}

fn attempt_record(
    cx: &Cx<'_>,
    envelope: &Envelope,
    report: &AttemptReport,
    started_ms: i64,
    clock: Instant,
) -> AttemptRecord {
    let kind = envelope.kind().as_str();
    let elapsed = clock.elapsed();
    cx.metrics.attempt_duration.with_label_values(&[kind]).observe(elapsed.as_secs_f64());
    cx.metrics.callback_responses.with_label_values(&[kind, report.class]).inc();
    tracing::info!(http_status = report.http_status, error = report.error.as_deref(), "attempt finished");
    AttemptRecord {
        attempt: envelope.attempt,
        started_at: rfc3339_from_millis(started_ms),
        duration_ms: elapsed.as_millis() as u64,
        http_status: report.http_status,
        error: report.error.clone(),
        outcome: AttemptOutcome::Success,
        prompt_tokens: None,
        completion_tokens: None,
        timed_out: report.class == "timeout",
    }
}

fn failed(
    report: &AttemptReport,
    record: AttemptRecord,
    held: HeldClaim,
    started_ms: i64,
    retry_after: Option<std::time::Duration>,
    permanent: bool,
) -> Outcome {
    let error = report.error.clone().unwrap_or_else(|| "failed".into());
    Outcome::Failed(Failure { record, error, retry_after, permanent, held, started_ms })
}

/// The result, the record and the attempt in one write under the claim (a turn's call owes its
/// turn the report in the same write); then the turn is told. A structured result that is not a
/// success ends the call `failed`, its safe error as the record's last error.
async fn succeed(
    cx: &Cx<'_>,
    envelope: &Envelope,
    parent: Option<&Parent<'_>>,
    held: HeldClaim,
    record: &AttemptRecord,
    outcome: CallOutcome,
) -> Outcome {
    let id = &envelope.execution_id;
    let kept = if outcome.ok { outcome.result.clone() } else { Value::Null };
    let status = if outcome.ok { ExecutionStatus::Succeeded } else { ExecutionStatus::Failed };
    let error = outcome.external.as_ref().and_then(|r| r.error.as_ref()).map(|e| format!("{}: {}", e.code, e.message));
    let mut done = Transition::new(ClaimAfter::Complete(&kept)).status(status).attempt(record);
    if let Some(external) = &outcome.external {
        done = done.field(field::EXTERNAL_RESULT, serde_json::to_string(external).expect("a result serialises"));
    }
    if let Some(error) = error.as_deref().filter(|_| !outcome.ok) {
        done = done.last_error(error);
    }
    if parent.is_some() {
        done = done.owe(&Owed::Parent);
    }
    let lease = cx.config.claim_lease;
    // Retried while Redis is down (a failover takes seconds): the claim still holds, and giving up
    // would send the callback again.
    match retrying_redis(lease / 3, || cx.store.executions().transition(id, Fence::Token(held.token), lease, &done))
        .await
    {
        Ok(true) => {}
        Ok(false) => return Outcome::Fenced,
        Err(e) => {
            tracing::warn!(error = %e, "cannot store the result; requeued");
            return Outcome::Requeue;
        }
    }
    let finished = if outcome.ok { Finished::Success } else { Finished::ToolFailed };
    let Some(parent) = parent else { return Outcome::Done(finished) };
    match parent::tool_call_finished(cx, envelope, parent, outcome).await {
        Ok(()) => {
            crate::publish::retire(cx, envelope, &Owed::Parent).await;
            Outcome::Done(finished)
        }
        // The record owes the report: the parked delivery, a copy now, carries it out.
        Err(outcome) => outcome,
    }
}
