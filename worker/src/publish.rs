//! Publishing what a job owes the broker (its next delivery, a park, a turn's calls): held until
//! the broker confirms, so a refused publish is tried again rather than the job re-run; and the
//! patient Redis write a transition after an attempt needs.

use std::future::Future;
use std::time::{Duration, Instant};

use lapin::types::FieldTable;

use fleet_platform::broker::BrokerError;
use fleet_platform::now_ms;
use fleet_platform::store::StoreError;
use fleet_platform::telemetry;
use fleet_protocol::envelope::Envelope;
use fleet_protocol::life::Owed;

use crate::context::Cx;
use crate::outcome::Settle;

/// Runs `op` until it answers, or Redis has been unavailable for `patience`.
pub(crate) async fn retrying_redis<T, F, Fut>(patience: Duration, mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + patience;
    let mut pause = Duration::from_millis(100);
    loop {
        match op().await {
            Err(e) if Instant::now() + pause < deadline => {
                tracing::debug!(error = %e, "Redis unavailable; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            done => return done,
        }
    }
}

/// Publishes until the broker confirms, holding the delivery meanwhile: a refused publish (a
/// missing queue, a nack during an election) is tried again, backing off to 5 s, for as long as
/// the connection lives. Its loss ends the wait: the delivery returns to the queue by itself.
pub(crate) async fn publish_holding<F, Fut>(cx: &Cx<'_>, envelope: &Envelope, mut publish: F) -> Result<(), Settle>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), BrokerError>>,
{
    let mut pause = Duration::from_millis(250);
    loop {
        match publish().await {
            Ok(()) => return Ok(()),
            Err(e) if !cx.publisher.connected() => {
                tracing::warn!(error = %e, "the connection is gone; the delivery returns to the queue");
                return Err(Settle::Abandon);
            }
            Err(e) => {
                tracing::warn!(error = %e, pause_ms = pause.as_millis() as u64, "the broker refused a publish the job owes; trying again");
                cx.metrics.outcome_publish_retries.with_label_values(&[envelope.kind().as_str()]).inc();
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Publishes a job's next delivery where it waits: the delay queue that fits what remains until
/// it is due, or its work queue.
pub(crate) async fn publish_next(cx: &Cx<'_>, next: &Envelope) -> Result<(), Settle> {
    let topology = &cx.config.common.topology;
    let remaining = next.not_before_ms.map_or(0, |due| due - now_ms());
    if remaining <= 0 {
        return publish_holding(cx, next, || cx.publisher.publish_job(topology, next, trace_headers())).await;
    }
    let step = cx.config.common.retry.park_step(Duration::from_millis(remaining as u64));
    let queue = topology.delay_queue(next.kind(), step);
    publish_holding(cx, next, || cx.publisher.publish_delayed(&queue, next, trace_headers())).await
}

/// Retires what the record owed once it is done; a failure leaves it to the next copy, which
/// finds it done (its publish arrives first) or does it again (a publish twice, not an effect).
pub(crate) async fn retire(cx: &Cx<'_>, envelope: &Envelope, owed: &Owed) {
    if let Err(e) = cx.store.executions().settle_owed(&envelope.execution_id, owed, &[]).await {
        tracing::debug!(error = %e, "what the step owed is done but not marked so");
    }
}

/// Holds a job in the delay queue that fits `remaining` without spending an attempt: the longest
/// of the ladder (retry delays and park queues, 250 ms to 1 h) that does not overshoot; on return
/// it is parked again until its `not_before_ms` is due.
pub(crate) async fn park(cx: &Cx<'_>, envelope: &Envelope, remaining: Duration) -> Settle {
    match hold(cx, envelope, remaining, envelope.park).await {
        Ok(_) => Settle::Ack,
        Err(settle) => settle,
    }
}

/// `park` by the step's claim holder, whose claim (`token`) was given back: the parked delivery
/// carries the token, and only once its publish is confirmed is the record marked parked by it
/// (a mark for a delivery not on a queue would refuse the job's every delivery until it expires).
/// A mark that cannot be written leaves the job as an unmarked park: copies then park beside it.
pub(crate) async fn park_step(cx: &Cx<'_>, envelope: &Envelope, remaining: Duration, token: u64) -> Settle {
    let until = match hold(cx, envelope, remaining, Some(token)).await {
        Ok(until) => until,
        Err(settle) => return settle,
    };
    match cx.store.executions().mark_parked(&envelope.execution_id, token, envelope.step(), until).await {
        Ok(true) => {}
        Ok(false) => tracing::debug!("not marked parked: a delivery was claimed since, or the step moved on"),
        Err(e) => tracing::debug!(error = %e, "cannot mark the step parked; its copies park beside it"),
    }
    Settle::Ack
}

/// Publishes the job due in `remaining`, carrying `park`: when it is due (ms), once confirmed.
async fn hold(cx: &Cx<'_>, envelope: &Envelope, remaining: Duration, park: Option<u64>) -> Result<i64, Settle> {
    let until = now_ms() + remaining.as_millis() as i64;
    let held = Envelope { not_before_ms: Some(until), park, ..envelope.clone() };
    publish_next(cx, &held).await.map(|()| until)
}

/// AMQP headers carrying the current span's trace context, so a retry continues the trace.
pub(crate) fn trace_headers() -> FieldTable {
    telemetry::amqp_headers(&tracing::Span::current())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn redis_is_tried_again_within_its_patience_only() {
        let calls = std::sync::atomic::AtomicU32::new(0);
        let gone = || async {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Err::<(), _>(StoreError::Corrupt("down".into()))
        };
        assert!(retrying_redis(Duration::from_millis(350), gone).await.is_err());
        let n = calls.load(std::sync::atomic::Ordering::SeqCst);
        assert!((2..=4).contains(&n), "{n} tries in 350 ms (100, 200 ms pauses)");
    }
}
