//! Checks an observed retry schedule wait by wait: never early, and late by less than half the
//! delay plus a fixed allowance. A loaded machine adds milliseconds to each hop and a starved test
//! process up to a few hundred; a wrong schedule is off by a whole step, which these bounds catch.

/// Clock granularity between the receiver's timestamps and the broker's TTL.
pub const EARLY_TOLERANCE_S: f64 = 0.05;
/// What a busy machine may add to any one wait, on top of half the delay.
pub const LATE_ALLOWANCE_S: f64 = 0.5;

/// The accepted range `[low, high)` of an observed wait for a configured `delay_s`.
pub fn wait_bounds(delay_s: f64) -> (f64, f64) {
    (delay_s - EARLY_TOLERANCE_S, delay_s * 1.5 + LATE_ALLOWANCE_S)
}

/// `Ok` when every observed wait lies within the bounds of its configured delay.
pub fn check_waits(observed_s: &[f64], expected_s: &[f64]) -> Result<(), String> {
    if observed_s.len() != expected_s.len() {
        return Err(format!("{} waits observed, {} expected ({observed_s:.2?})", observed_s.len(), expected_s.len()));
    }
    for (i, (&got, &delay)) in observed_s.iter().zip(expected_s).enumerate() {
        let (low, high) = wait_bounds(delay);
        if got < low || got >= high {
            return Err(format!(
                "wait {} was {got:.2}s, expected {delay}s (accepted {low:.2}..{high:.2}s); all waits {observed_s:.2?}",
                i + 1
            ));
        }
    }
    Ok(())
}

/// The gaps between consecutive instants, in seconds.
pub fn gaps(at: &[std::time::Instant]) -> Vec<f64> {
    at.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: [f64; 5] = [1.0, 2.0, 4.0, 8.0, 16.0];

    fn late_by(extra: f64) -> Vec<f64> {
        SEED.iter().map(|d| d + extra).collect()
    }

    #[test]
    fn the_seed_schedule_passes_on_a_busy_machine() {
        assert!(check_waits(&SEED, &SEED).is_ok());
        assert!(check_waits(&late_by(0.49), &SEED).is_ok());
        // The lateness that failed the old fixed bound (first wait 1.86 s) is within bounds.
        assert!(check_waits(&[1.86, 2.1, 4.2, 8.3, 16.4], &SEED).is_ok());
    }

    #[test]
    fn every_wrong_schedule_fails() {
        let wrong: [(&str, Vec<f64>); 7] = [
            ("shifted one step", vec![2.0, 4.0, 8.0, 16.0, 32.0]),
            ("halved", SEED.iter().map(|d| d / 2.0).collect()),
            ("constant 1 s", vec![1.0; 5]),
            ("immediate retries", vec![0.01; 5]),
            ("one step repeated", vec![1.0, 2.0, 2.0, 8.0, 16.0]),
            ("one attempt missing", vec![1.0, 2.0, 4.0, 8.0]),
            ("early by 100 ms", late_by(-0.1)),
        ];
        for (what, observed) in wrong {
            assert!(check_waits(&observed, &SEED).is_err(), "{what} passed: {observed:?}");
        }
    }

    #[test]
    fn bounds_widen_with_the_delay() {
        assert_eq!(wait_bounds(1.0), (0.95, 2.0));
        assert_eq!(wait_bounds(16.0), (15.95, 24.5));
    }
}
