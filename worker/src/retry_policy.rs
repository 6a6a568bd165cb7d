//! Which retry schedule a failed job follows: its tool's or webhook's own (`retry` in the
//! registry), else the fleet's default (`FLEET_RETRY_DELAYS`); and the decision it makes.

use std::time::Duration;

use fleet_protocol::envelope::{Envelope, Job};
use fleet_protocol::retry::{RetryDecision, RetryPolicy, RetrySchedule};

use crate::context::Cx;

/// The schedule a job's registry entry names, as far as the worker could read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScheduleFound {
    /// The tool or webhook has a schedule of its own.
    Own(RetrySchedule),
    /// It has none (or is a turn step, or no longer registered): the fleet's default.
    Default,
    /// The registry could not be read: the entry's schedule is not known.
    Unknown,
}

/// After attempt `failed_attempt` failed: the next attempt, its wait and delay queue, or the dead
/// letter. With the schedule unknown (registry unreachable), a job the default would dead-letter
/// is retried after the default's longest delay instead: its own schedule may allow more, and a
/// dead letter cannot be taken back once the registry answers again.
pub(crate) fn decide(
    policy: &RetryPolicy,
    found: &ScheduleFound,
    failed_attempt: u32,
    retry_after: Option<Duration>,
) -> RetryDecision {
    match found {
        ScheduleFound::Own(schedule) => policy.after_failure_under(schedule, failed_attempt, retry_after),
        ScheduleFound::Default => policy.after_failure(failed_attempt, retry_after),
        ScheduleFound::Unknown => match policy.after_failure(failed_attempt, retry_after) {
            RetryDecision::Exhausted => {
                let longest = policy.delays().iter().copied().max().unwrap_or_default();
                let wait = longest.max(retry_after.unwrap_or_default().min(policy.schedule().retry_after_cap()));
                RetryDecision::Retry { next_attempt: failed_attempt + 1, wait, step: policy.park_step(wait) }
            }
            retry => retry,
        },
    }
}

/// The retry decision for `envelope`'s failed attempt, under the schedule its registry entry names.
pub(crate) async fn decision(cx: &Cx<'_>, envelope: &Envelope, retry_after: Option<Duration>) -> RetryDecision {
    let found = schedule_for(cx, &envelope.job).await;
    decide(&cx.config.common.retry, &found, envelope.attempt, retry_after)
}

/// Reads the schedule of the job's tool or webhook (only after a failure, so not on the hot path).
async fn schedule_for(cx: &Cx<'_>, job: &Job) -> ScheduleFound {
    let read = match job {
        Job::ToolCall(call) => cx.store.registry().get_tool(&call.tool_name).await.map(|t| t.and_then(|t| t.retry)),
        Job::Webhook(hook) => cx.store.registry().get_webhook(&hook.webhook_id).await.map(|h| h.and_then(|h| h.retry)),
        Job::Turn(_) => return ScheduleFound::Default,
    };
    match read {
        Ok(Some(spec)) => ScheduleFound::Own(spec.schedule()),
        Ok(None) => ScheduleFound::Default,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the retry schedule; the default's, without dead-lettering");
            ScheduleFound::Unknown
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_of(decision: RetryDecision) -> (u32, Duration) {
        match decision {
            RetryDecision::Retry { next_attempt, wait, .. } => (next_attempt, wait),
            RetryDecision::Exhausted => panic!("expected a retry"),
        }
    }

    #[test]
    fn a_tools_own_schedule_decides_attempts_and_waits() {
        let policy = RetryPolicy::default();
        let own = ScheduleFound::Own(RetrySchedule::new([5, 7200].map(Duration::from_secs).to_vec()));
        assert_eq!(wait_of(decide(&policy, &own, 1, None)), (2, Duration::from_secs(5)));
        let RetryDecision::Retry { wait, step, .. } = decide(&policy, &own, 2, None) else { panic!() };
        assert_eq!(wait, Duration::from_secs(7200));
        assert_eq!(policy.ladder()[step], Duration::from_secs(3600), "a 2 h wait starts in the 1 h queue");
        assert_eq!(decide(&policy, &own, 3, None), RetryDecision::Exhausted);
        // The default would have retried a third failure; the tool's schedule does not.
        assert_eq!(wait_of(decide(&policy, &ScheduleFound::Default, 3, None)), (4, Duration::from_secs(4)));
    }

    #[test]
    fn a_long_schedule_outlives_the_defaults_six_attempts() {
        let policy = RetryPolicy::default();
        let own =
            ScheduleFound::Own(RetrySchedule::new([5, 10, 20, 40, 60, 120, 300].map(Duration::from_secs).to_vec()));
        assert_eq!(decide(&policy, &ScheduleFound::Default, 6, None), RetryDecision::Exhausted);
        assert_eq!(wait_of(decide(&policy, &own, 6, None)), (7, Duration::from_secs(120)));
        assert_eq!(wait_of(decide(&policy, &own, 7, None)), (8, Duration::from_secs(300)));
        assert_eq!(decide(&policy, &own, 8, None), RetryDecision::Exhausted);
    }

    #[test]
    fn an_unknown_schedule_never_dead_letters() {
        let policy = RetryPolicy::default();
        let unknown = ScheduleFound::Unknown;
        assert_eq!(wait_of(decide(&policy, &unknown, 1, None)), (2, Duration::from_secs(1)));
        assert_eq!(wait_of(decide(&policy, &unknown, 6, None)), (7, Duration::from_secs(16)));
        assert_eq!(wait_of(decide(&policy, &unknown, 9, Some(Duration::from_secs(60)))), (10, Duration::from_secs(60)));
    }
}
