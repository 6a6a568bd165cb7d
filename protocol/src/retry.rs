//! The retry schedule: which attempt comes next, how long it waits, and which delay queue holds it.

use std::time::Duration;

/// The seed's schedule: attempt 1 immediately, then 1, 2, 4, 8 and 16 s later (6 attempts).
pub fn default_delays() -> Vec<Duration> {
    [1, 2, 4, 8, 16].map(Duration::from_secs).to_vec()
}

/// The longest `Retry-After` the fleet honours; a longer one is held to this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(15 * 60);

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Run `next_attempt` after `wait`, parked first in delay queue `step`.
    Retry { next_attempt: u32, wait: Duration, step: usize },
    /// No attempts left: dead-letter.
    Exhausted,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    delays: Vec<Duration>,
}

impl RetryPolicy {
    /// `delays[i]` is the wait before attempt `i + 2`; there are `delays.len() + 1` attempts in all.
    /// The delays must be non-empty and ascending (they double as the delay queues' TTLs).
    pub fn new(delays: Vec<Duration>) -> Result<Self, String> {
        if delays.is_empty() {
            return Err("at least one retry delay is needed".into());
        }
        if delays.iter().any(|d| d.is_zero()) {
            return Err("retry delays must be greater than zero".into());
        }
        if delays.windows(2).any(|w| w[0] > w[1]) {
            return Err("retry delays must be in ascending order".into());
        }
        Ok(RetryPolicy { delays })
    }

    pub fn delays(&self) -> &[Duration] {
        &self.delays
    }

    pub fn max_attempts(&self) -> u32 {
        self.delays.len() as u32 + 1
    }

    /// After attempt `failed_attempt` failed: the next attempt and its wait. A `Retry-After` may
    /// lengthen the scheduled wait (up to [`MAX_RETRY_AFTER`]) but never shortens it.
    pub fn after_failure(&self, failed_attempt: u32, retry_after: Option<Duration>) -> RetryDecision {
        if failed_attempt == 0 || failed_attempt >= self.max_attempts() {
            return RetryDecision::Exhausted;
        }
        let scheduled = self.delays[failed_attempt as usize - 1];
        let wait = scheduled.max(retry_after.unwrap_or_default().min(MAX_RETRY_AFTER));
        RetryDecision::Retry { next_attempt: failed_attempt + 1, wait, step: self.park_step(wait) }
    }

    /// The delay queue to hold a job that must wait `remaining`: the longest delay that does not
    /// overshoot, or the shortest one if even that does. A job that comes back early (its
    /// `not_before` still ahead) is parked again for what remains, so waits are never shortened.
    pub fn park_step(&self, remaining: Duration) -> usize {
        self.delays.iter().rposition(|d| *d <= remaining).unwrap_or(0)
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { delays: default_delays() }
    }
}

/// Tolerance for a job that returns from a delay queue a little early (broker TTL granularity):
/// it runs instead of being parked for a few milliseconds.
pub const EARLY_RETURN_TOLERANCE: Duration = Duration::from_millis(50);

/// Whether a job with `not_before_ms` must be parked again at `now_ms`, and for how long.
pub fn remaining_hold(not_before_ms: Option<i64>, now_ms: i64) -> Option<Duration> {
    let remaining = not_before_ms? - now_ms;
    (remaining > EARLY_RETURN_TOLERANCE.as_millis() as i64).then(|| Duration::from_millis(remaining as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_schedule_is_the_seeds() {
        let p = RetryPolicy::default();
        assert_eq!(p.max_attempts(), 6);
        let waits: Vec<u64> = (1..=5)
            .map(|a| match p.after_failure(a, None) {
                RetryDecision::Retry { next_attempt, wait, step } => {
                    assert_eq!(next_attempt, a + 1);
                    assert_eq!(step, a as usize - 1, "attempt {} waits in its own delay queue", a + 1);
                    wait.as_secs()
                }
                RetryDecision::Exhausted => panic!("attempt {a} should retry"),
            })
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16]);
        let cumulative: Vec<u64> = waits
            .iter()
            .scan(0, |acc, w| {
                *acc += w;
                Some(*acc)
            })
            .collect();
        assert_eq!(cumulative, [1, 3, 7, 15, 31]);
        assert_eq!(p.after_failure(6, None), RetryDecision::Exhausted);
    }

    #[test]
    fn retry_after_lengthens_but_never_shortens() {
        let p = RetryPolicy::default();
        let wait = |a, ra| match p.after_failure(a, ra) {
            RetryDecision::Retry { wait, .. } => wait,
            RetryDecision::Exhausted => panic!(),
        };
        assert_eq!(wait(1, Some(Duration::from_secs(10))), Duration::from_secs(10));
        assert_eq!(wait(4, Some(Duration::from_secs(1))), Duration::from_secs(8));
        assert_eq!(wait(1, Some(Duration::from_secs(86_400))), MAX_RETRY_AFTER);
    }

    #[test]
    fn parking_never_overshoots_more_than_the_shortest_delay() {
        let p = RetryPolicy::default();
        assert_eq!(p.park_step(Duration::from_secs(10)), 3); // 8 s, then 2 s more
        assert_eq!(p.park_step(Duration::from_secs(16)), 4);
        assert_eq!(p.park_step(Duration::from_secs(100)), 4);
        assert_eq!(p.park_step(Duration::from_millis(300)), 0);
    }

    #[test]
    fn early_returns_within_tolerance_run() {
        assert_eq!(remaining_hold(None, 1_000), None);
        assert_eq!(remaining_hold(Some(1_020), 1_000), None);
        assert_eq!(remaining_hold(Some(3_000), 1_000), Some(Duration::from_secs(2)));
    }

    #[test]
    fn bad_schedules_are_refused() {
        assert!(RetryPolicy::new(vec![]).is_err());
        assert!(RetryPolicy::new(vec![Duration::from_secs(2), Duration::from_secs(1)]).is_err());
        assert!(RetryPolicy::new(vec![Duration::ZERO]).is_err());
    }
}
