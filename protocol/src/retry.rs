//! The retry schedule: which attempt comes next, how long it waits, and which delay queue holds it.
//!
//! Two things live here. A [`RetrySchedule`] is how many attempts a job gets and the waits between
//! them: the fleet's default (`FLEET_RETRY_DELAYS`) or a tool's or webhook's own (`retry`, see
//! [`crate::retry_spec`]). The [`RetryPolicy`] is the fleet's: its default schedule plus the
//! *ladder*, the TTLs of every delay queue the topology declares (the default schedule's delays
//! and the fixed [`PARK_DELAYS`]). Any wait, however long, is held by the ladder: the job goes to
//! the longest queue that does not overshoot, and on return is parked again until it is due.

use std::time::Duration;

/// The seed's schedule: attempt 1 immediately, then 1, 2, 4, 8 and 16 s later (6 attempts).
pub fn default_delays() -> Vec<Duration> {
    [1, 2, 4, 8, 16].map(Duration::from_secs).to_vec()
}

/// The park queues every job kind has besides the retry delay queues: 250 ms, 5 s, 1 min,
/// 10 min, 1 h. With them any wait (a per-tool schedule's 10 h, a scheduled call's `run_at`, a
/// limiter's 300 ms deferral) is held by the broker in a few hops, never one queue per value.
pub const PARK_DELAYS: [Duration; 5] = [
    Duration::from_millis(250),
    Duration::from_secs(5),
    Duration::from_secs(60),
    Duration::from_secs(600),
    Duration::from_secs(3600),
];

/// The longest `Retry-After` honoured under a schedule whose delays are all shorter; a longer one
/// is held to this. A schedule with a longer delay honours up to its longest delay instead.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(15 * 60);

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Run `next_attempt` after `wait`, parked first in delay queue `step` (of the ladder).
    Retry { next_attempt: u32, wait: Duration, step: usize },
    /// No attempts left: dead-letter.
    Exhausted,
}

/// How many attempts a job gets and the wait before each: `delays[i]` precedes attempt `i + 2`.
/// Any order is allowed (the ladder holds any wait); an empty list means one attempt only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySchedule {
    delays: Vec<Duration>,
}

impl RetrySchedule {
    /// A schedule from waits already checked (`RetrySpec::check`, or the fleet's config).
    pub fn new(delays: Vec<Duration>) -> Self {
        RetrySchedule { delays }
    }

    pub fn delays(&self) -> &[Duration] {
        &self.delays
    }

    pub fn max_attempts(&self) -> u32 {
        self.delays.len() as u32 + 1
    }

    /// The longest `Retry-After` this schedule honours: [`MAX_RETRY_AFTER`], or its longest delay
    /// if that is longer (a tool owner on a 10 h schedule may ask for 10 h).
    pub fn retry_after_cap(&self) -> Duration {
        self.delays.iter().copied().max().unwrap_or_default().max(MAX_RETRY_AFTER)
    }

    /// After attempt `failed_attempt` failed: the next attempt and its wait, or `None` when none
    /// is left. A `Retry-After` may lengthen the scheduled wait (up to [`Self::retry_after_cap`])
    /// but never shortens it.
    pub fn next_after(&self, failed_attempt: u32, retry_after: Option<Duration>) -> Option<(u32, Duration)> {
        if failed_attempt == 0 || failed_attempt >= self.max_attempts() {
            return None;
        }
        let scheduled = self.delays[failed_attempt as usize - 1];
        let asked = retry_after.unwrap_or_default().min(self.retry_after_cap());
        Some((failed_attempt + 1, scheduled.max(asked)))
    }

    /// The whole window from the first attempt to the last, without `Retry-After`s.
    pub fn window(&self) -> Duration {
        self.delays.iter().sum()
    }
}

/// The delay queues' TTLs: the retry delays and [`PARK_DELAYS`], ascending, without repeats.
/// The topology declares one queue per entry and per job kind; a step is an index into it.
pub fn delay_ladder(retry_delays: &[Duration]) -> Vec<Duration> {
    let mut ladder: Vec<Duration> = retry_delays.iter().chain(PARK_DELAYS.iter()).copied().collect();
    ladder.sort();
    ladder.dedup();
    ladder
}

/// The ladder step to hold a job that must wait `remaining`: the longest TTL that does not
/// overshoot, or the shortest one if even that does. A job that comes back early (its
/// `not_before` still ahead) is parked again for what remains, so waits are never shortened.
pub fn ladder_step(ladder: &[Duration], remaining: Duration) -> usize {
    ladder.iter().rposition(|d| *d <= remaining).unwrap_or(0)
}

/// The fleet's retry policy: the default schedule (`FLEET_RETRY_DELAYS`) and the delay ladder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    schedule: RetrySchedule,
    ladder: Vec<Duration>,
}

impl RetryPolicy {
    /// `delays[i]` is the wait before attempt `i + 2`; there are `delays.len() + 1` attempts in all.
    /// The delays must be non-empty and ascending (they double as delay queues' TTLs).
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
        Ok(RetryPolicy { ladder: delay_ladder(&delays), schedule: RetrySchedule::new(delays) })
    }

    /// The default schedule's delays.
    pub fn delays(&self) -> &[Duration] {
        self.schedule.delays()
    }

    /// The default schedule.
    pub fn schedule(&self) -> &RetrySchedule {
        &self.schedule
    }

    /// Every delay queue's TTL, ascending (see [`delay_ladder`]).
    pub fn ladder(&self) -> &[Duration] {
        &self.ladder
    }

    pub fn max_attempts(&self) -> u32 {
        self.schedule.max_attempts()
    }

    /// After attempt `failed_attempt` failed, under the default schedule.
    pub fn after_failure(&self, failed_attempt: u32, retry_after: Option<Duration>) -> RetryDecision {
        self.after_failure_under(&self.schedule, failed_attempt, retry_after)
    }

    /// After attempt `failed_attempt` failed, under `schedule` (a tool's own, or the default):
    /// the next attempt, its wait, and the ladder step that holds it first.
    pub fn after_failure_under(
        &self,
        schedule: &RetrySchedule,
        failed_attempt: u32,
        retry_after: Option<Duration>,
    ) -> RetryDecision {
        match schedule.next_after(failed_attempt, retry_after) {
            Some((next_attempt, wait)) => RetryDecision::Retry { next_attempt, wait, step: self.park_step(wait) },
            None => RetryDecision::Exhausted,
        }
    }

    /// The delay queue (ladder step) to hold a job that must wait `remaining`: see [`ladder_step`].
    pub fn park_step(&self, remaining: Duration) -> usize {
        ladder_step(&self.ladder, remaining)
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy::new(default_delays()).expect("the seed's schedule is valid")
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

    const HOUR: u64 = 3600;

    /// The ladder TTLs a job passes through while waiting `wait` (each hop parks for what remains).
    fn hops(policy: &RetryPolicy, wait: Duration) -> Vec<Duration> {
        let mut remaining = wait;
        let mut hops = Vec::new();
        loop {
            let ttl = policy.ladder()[policy.park_step(remaining)];
            hops.push(ttl);
            remaining = remaining.saturating_sub(ttl);
            if remaining <= EARLY_RETURN_TOLERANCE {
                return hops;
            }
            assert!(hops.len() < 1000, "a wait of {wait:?} never ends");
        }
    }

    #[test]
    fn the_default_schedule_is_the_seeds() {
        let p = RetryPolicy::default();
        assert_eq!(p.max_attempts(), 6);
        let waits: Vec<u64> = (1..=5)
            .map(|a| match p.after_failure(a, None) {
                RetryDecision::Retry { next_attempt, wait, step } => {
                    assert_eq!(next_attempt, a + 1);
                    assert_eq!(p.ladder()[step], wait, "attempt {} waits in its own delay queue", a + 1);
                    wait.as_secs()
                }
                RetryDecision::Exhausted => panic!("attempt {a} should retry"),
            })
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16]);
        assert_eq!(p.schedule().window(), Duration::from_secs(31));
        assert_eq!(p.after_failure(6, None), RetryDecision::Exhausted);
    }

    #[test]
    fn the_ladder_is_the_retry_delays_and_the_park_queues() {
        let p = RetryPolicy::default();
        let secs: Vec<f64> = p.ladder().iter().map(Duration::as_secs_f64).collect();
        assert_eq!(secs, [0.25, 1.0, 2.0, 4.0, 5.0, 8.0, 16.0, 60.0, 600.0, 3600.0]);
        // A retry delay equal to a park delay is one queue, not two.
        assert_eq!(delay_ladder(&[Duration::from_secs(5)]).len(), PARK_DELAYS.len());
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
    fn a_long_schedule_honours_retry_after_up_to_its_longest_delay() {
        let p = RetryPolicy::default();
        let long = RetrySchedule::new([5, 10 * HOUR].map(Duration::from_secs).to_vec());
        assert_eq!(long.retry_after_cap(), Duration::from_secs(10 * HOUR));
        let wait = |a, ra| match p.after_failure_under(&long, a, ra) {
            RetryDecision::Retry { wait, .. } => wait,
            RetryDecision::Exhausted => panic!(),
        };
        assert_eq!(wait(1, Some(Duration::from_secs(2 * HOUR))), Duration::from_secs(2 * HOUR));
        assert_eq!(wait(1, Some(Duration::from_secs(30 * HOUR))), Duration::from_secs(10 * HOUR));
        assert_eq!(wait(2, Some(Duration::from_secs(60))), Duration::from_secs(10 * HOUR), "never shorter");
        assert_eq!(p.after_failure_under(&long, 3, None), RetryDecision::Exhausted);
    }

    #[test]
    fn an_svix_like_27_hour_schedule_runs_8_attempts_through_the_ladder() {
        let p = RetryPolicy::default();
        let delays = [5, 300, 1800, 2 * HOUR, 5 * HOUR, 10 * HOUR, 10 * HOUR].map(Duration::from_secs);
        let svix = RetrySchedule::new(delays.to_vec());
        assert_eq!(svix.max_attempts(), 8);
        assert_eq!(svix.window().as_secs(), 5 + 300 + 1800 + 27 * HOUR);
        let mut at = Duration::ZERO;
        let mut total_hops = 0;
        for failed in 1..=7 {
            let RetryDecision::Retry { next_attempt, wait, step } = p.after_failure_under(&svix, failed, None) else {
                panic!("attempt {failed} should retry");
            };
            assert_eq!((next_attempt, wait), (failed + 1, delays[failed as usize - 1]));
            assert!(p.ladder()[step] <= wait, "the first hop never overshoots");
            let chain = hops(&p, wait);
            assert_eq!(chain.iter().sum::<Duration>(), wait, "the hops add up to the wait exactly");
            total_hops += chain.len();
            at += wait;
        }
        assert_eq!(at.as_secs(), svix.window().as_secs());
        assert_eq!(p.after_failure_under(&svix, 8, None), RetryDecision::Exhausted);
        // 5 s: 1 hop; 300 s: 5 × 1 min; 30 min: 3 × 10 min; 2 h, 5 h, 10 h, 10 h: 27 × 1 h.
        assert_eq!(total_hops, 1 + 5 + 3 + 27);
    }

    #[test]
    fn re_park_chains_use_the_longest_queue_that_fits() {
        let p = RetryPolicy::default();
        let s = Duration::from_secs;
        assert_eq!(hops(&p, s(2 * HOUR)), [s(HOUR), s(HOUR)]);
        assert_eq!(hops(&p, s(HOUR + 660)), [s(HOUR), s(600), s(60)]);
        assert_eq!(hops(&p, s(10)), [s(8), s(2)]);
        assert_eq!(hops(&p, Duration::from_millis(300)), [Duration::from_millis(250)]);
        assert_eq!(hops(&p, Duration::from_millis(100)), [Duration::from_millis(250)], "the shortest overshoots");
    }

    #[test]
    fn parking_never_overshoots_more_than_the_shortest_delay() {
        let p = RetryPolicy::default();
        let ttl = |remaining| p.ladder()[p.park_step(remaining)];
        assert_eq!(ttl(Duration::from_secs(10)), Duration::from_secs(8)); // 8 s, then 2 s more
        assert_eq!(ttl(Duration::from_secs(16)), Duration::from_secs(16));
        assert_eq!(ttl(Duration::from_secs(100)), Duration::from_secs(60));
        assert_eq!(ttl(Duration::from_secs(86_400)), Duration::from_secs(3600));
        assert_eq!(ttl(Duration::from_millis(300)), Duration::from_millis(250));
        assert_eq!(ttl(Duration::from_millis(10)), Duration::from_millis(250));
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
