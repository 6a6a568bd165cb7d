//! Scheduled jobs: when a call with `run_at` or `delay_seconds` is due, and where a new job is
//! first published (its kind's work queue, or the delay queue that holds it until it is due).

use std::time::Duration;

use crate::envelope::Envelope;
use crate::retry::{remaining_hold, RetryPolicy};
use crate::topology::Topology;

/// The furthest ahead a call may be scheduled.
pub const MAX_SCHEDULE_HORIZON: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// Why a call's schedule is refused (each names the field, for a 422).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    #[error("run_at and delay_seconds: give at most one of them")]
    Both,
    #[error("run_at: {0:?} is not an RFC 3339 timestamp (e.g. 2026-01-20T12:00:00Z)")]
    NotATime(String),
    #[error("delay_seconds: must be a number of seconds, 0 or more")]
    NegativeDelay,
    #[error("{field}: is more than {} days ahead, the furthest a call may be scheduled", MAX_SCHEDULE_HORIZON.as_secs() / 86_400)]
    TooFar { field: &'static str },
}

impl ScheduleError {
    /// The request field the refusal is about.
    pub fn field(&self) -> &'static str {
        match self {
            ScheduleError::Both | ScheduleError::NotATime(_) => "run_at",
            ScheduleError::NegativeDelay => "delay_seconds",
            ScheduleError::TooFar { field } => field,
        }
    }
}

/// When a call is due (ms since the epoch), or `None` when it runs now: neither field given, a
/// `run_at` in the past, or a delay of zero.
pub fn due_at(run_at: Option<&str>, delay_seconds: Option<f64>, now_ms: i64) -> Result<Option<i64>, ScheduleError> {
    let horizon_ms = MAX_SCHEDULE_HORIZON.as_millis() as i64;
    let (due, field) = match (run_at, delay_seconds) {
        (Some(_), Some(_)) => return Err(ScheduleError::Both),
        (None, None) => return Ok(None),
        (Some(text), None) => {
            let at = crate::timefmt::millis_from_rfc3339(text).ok_or_else(|| ScheduleError::NotATime(text.into()))?;
            (at, "run_at")
        }
        (None, Some(secs)) => {
            if secs.is_nan() || secs < 0.0 {
                return Err(ScheduleError::NegativeDelay);
            }
            // Saturating: a huge delay is refused below, never wrapped.
            (now_ms.saturating_add((secs * 1000.0).min(i64::MAX as f64 / 2.0) as i64), "delay_seconds")
        }
    };
    if due.saturating_sub(now_ms) > horizon_ms {
        return Err(ScheduleError::TooFar { field });
    }
    Ok((due > now_ms).then_some(due))
}

/// Where a new job is first published at `now_ms`: `(exchange, routing_key)`. A job not yet due
/// (`not_before_ms` ahead) goes to the delay queue that fits the wait, without overshooting
/// (`RetryPolicy::park_step`); the worker parks it again on its return until it is due. Any other
/// job goes to its kind's work queue through the jobs exchange.
pub fn first_destination(
    topology: &Topology,
    retry: &RetryPolicy,
    envelope: &Envelope,
    now_ms: i64,
) -> (String, String) {
    match remaining_hold(envelope.not_before_ms, now_ms) {
        Some(wait) => (String::new(), topology.delay_queue(envelope.kind(), retry.park_step(wait))),
        None => (topology.jobs_exchange(), envelope.kind().as_str().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{Job, ToolCallJob};

    const NOW: i64 = 1_768_910_400_000; // 2026-01-20T12:00:00Z

    #[test]
    fn no_schedule_or_a_past_one_runs_now() {
        assert_eq!(due_at(None, None, NOW), Ok(None));
        assert_eq!(due_at(Some("2020-01-01T00:00:00Z"), None, NOW), Ok(None));
        assert_eq!(due_at(Some("2026-01-20T12:00:00Z"), None, NOW), Ok(None));
        assert_eq!(due_at(None, Some(0.0), NOW), Ok(None));
    }

    #[test]
    fn a_future_time_or_a_delay_is_due_then() {
        assert_eq!(due_at(Some("2026-01-20T12:00:03Z"), None, NOW), Ok(Some(NOW + 3_000)));
        assert_eq!(due_at(Some("2026-01-20T13:00:03+01:00"), None, NOW), Ok(Some(NOW + 3_000)));
        assert_eq!(due_at(None, Some(2.5), NOW), Ok(Some(NOW + 2_500)));
        assert_eq!(due_at(None, Some(30.0 * 86_400.0), NOW), Ok(Some(NOW + 30 * 86_400_000)));
    }

    #[test]
    fn both_fields_a_bad_time_a_negative_delay_or_beyond_the_horizon_is_refused() {
        assert_eq!(due_at(Some("2026-01-20T12:00:03Z"), Some(1.0), NOW), Err(ScheduleError::Both));
        assert!(matches!(due_at(Some("tomorrow"), None, NOW), Err(ScheduleError::NotATime(_))));
        assert_eq!(due_at(None, Some(-1.0), NOW), Err(ScheduleError::NegativeDelay));
        assert_eq!(due_at(None, Some(f64::NAN), NOW), Err(ScheduleError::NegativeDelay));
        assert_eq!(due_at(None, Some(31.0 * 86_400.0), NOW), Err(ScheduleError::TooFar { field: "delay_seconds" }));
        assert_eq!(due_at(None, Some(1e300), NOW), Err(ScheduleError::TooFar { field: "delay_seconds" }));
        assert_eq!(due_at(Some("2026-03-01T00:00:00Z"), None, NOW), Err(ScheduleError::TooFar { field: "run_at" }));
        for e in [ScheduleError::Both, ScheduleError::NegativeDelay, ScheduleError::TooFar { field: "delay_seconds" }] {
            assert!(e.to_string().starts_with(e.field()), "{e}");
        }
    }

    #[test]
    fn a_job_not_yet_due_goes_to_the_delay_queue_that_fits_and_a_due_one_to_work() {
        let topology = Topology::new("fleet", crate::retry::default_delays());
        let retry = RetryPolicy::default();
        let job = Job::ToolCall(ToolCallJob {
            tool_name: "t".into(),
            parameters: serde_json::json!({}),
            room_id: None,
            assistant_id: None,
            parent: None,
        });
        let mut envelope = Envelope::new("exec_1".into(), job, NOW);
        let work = ("fleet.jobs".to_string(), "tool_call".to_string());
        assert_eq!(first_destination(&topology, &retry, &envelope, NOW), work);
        envelope.not_before_ms = Some(NOW + 3_000);
        assert_eq!(
            first_destination(&topology, &retry, &envelope, NOW),
            (String::new(), "fleet.delay.tool_calls.2s".into())
        );
        // A day away: the longest park queue, an hour; it is parked again on each return.
        envelope.not_before_ms = Some(NOW + 86_400_000);
        assert_eq!(
            first_destination(&topology, &retry, &envelope, NOW),
            (String::new(), "fleet.delay.tool_calls.3600s".into())
        );
        envelope.not_before_ms = Some(NOW - 1);
        assert_eq!(first_destination(&topology, &retry, &envelope, NOW), work);
    }
}
