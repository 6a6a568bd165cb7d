//! A tool's or webhook's own retry schedule as the API takes and the registry stores it:
//! `retry: {"attempts": N, "delays": [seconds…]}`, its checks, and the schedule it makes.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use crate::retry::RetrySchedule;

/// The most attempts a schedule may have.
pub const MAX_ATTEMPTS: u32 = 20;

/// The longest retry window (sum of the delays): 72 h. It stays well inside the 7 days the
/// fleet keeps claims, results and `Idempotency-Key` mappings, so a call retried at the end of
/// its window is still deduplicated.
pub const MAX_WINDOW: Duration = Duration::from_secs(72 * 3600);

/// A tool's or webhook's own retry schedule (`null` or absent: the fleet's default, 6 attempts at
/// 0, 1, 2, 4, 8, 16 s). Waits are held by the broker; the window may be at most 72 h.
/// (`delays[i]` is the wait before attempt `i + 2`.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(example = json!({"attempts": 8, "delays": [5, 300, 1800, 7200, 18000, 36000, 36000]})))]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// Attempts in all, 1-20 (the first runs at once).
    #[cfg_attr(feature = "schema", schema(minimum = 1, maximum = 20))]
    pub attempts: u32,
    /// Whole seconds (≥ 1) before each attempt after the first: exactly `attempts - 1` entries,
    /// any order, adding up to at most 259200 (72 h).
    #[cfg_attr(feature = "schema", schema(max_items = 19))]
    #[serde(default)]
    pub delays: Vec<u64>,
}

/// Why a `retry` was refused; each message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetrySpecError {
    #[error("retry.attempts must be 1-{MAX_ATTEMPTS}, got {0}")]
    Attempts(u32),
    #[error("retry.delays must have attempts - 1 = {expected} entries (the wait before each attempt after the first), got {got}")]
    DelayCount { expected: usize, got: usize },
    #[error("retry.delays[{index}] must be at least 1 second")]
    ZeroDelay { index: usize },
    #[error("retry.delays add up to {total_secs} s; the retry window may be at most {} s (72 h)", MAX_WINDOW.as_secs())]
    Window { total_secs: u64 },
}

impl RetrySpec {
    /// The checks a `retry` must pass before it is stored.
    pub fn check(&self) -> Result<(), RetrySpecError> {
        if !(1..=MAX_ATTEMPTS).contains(&self.attempts) {
            return Err(RetrySpecError::Attempts(self.attempts));
        }
        let expected = self.attempts as usize - 1;
        if self.delays.len() != expected {
            return Err(RetrySpecError::DelayCount { expected, got: self.delays.len() });
        }
        if let Some(index) = self.delays.iter().position(|d| *d == 0) {
            return Err(RetrySpecError::ZeroDelay { index });
        }
        let total_secs = self.delays.iter().fold(0u64, |acc, d| acc.saturating_add(*d));
        if total_secs > MAX_WINDOW.as_secs() {
            return Err(RetrySpecError::Window { total_secs });
        }
        Ok(())
    }

    /// The schedule the worker follows.
    pub fn schedule(&self) -> RetrySchedule {
        RetrySchedule::new(self.delays.iter().map(|s| Duration::from_secs(*s)).collect())
    }
}

/// The `retry` a write leaves stored: `update` as given (`Some(None)`, an explicit `null`, goes
/// back to the default), or the `current` one when the write does not name it.
pub fn updated(update: &Option<Option<RetrySpec>>, current: Option<&RetrySpec>) -> Option<RetrySpec> {
    match update {
        Some(given) => given.clone(),
        None => current.cloned(),
    }
}

/// For an optional object field where `null` means something (back to the default) and absence
/// means "leave it": absent → `None` (with `#[serde(default)]`), `null` → `Some(None)`, an object →
/// `Some(Some(value))`.
pub fn explicit_null<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<ObjectOnly<T>>::deserialize(deserializer).map(|v| Some(v.map(|o| o.0)))
}

/// A struct read only from a JSON object: serde's derive would also read it from an array of its
/// fields in order, which no client means. Errors keep their path (`retry.delays[1]: …`).
pub struct ObjectOnly<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = ObjectOnly<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(ObjectOnly)
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(attempts: u32, delays: &[u64]) -> RetrySpec {
        RetrySpec { attempts, delays: delays.to_vec() }
    }

    #[test]
    fn a_27_hour_svix_schedule_is_accepted() {
        let svix = spec(8, &[5, 300, 1800, 7200, 18_000, 36_000, 36_000]);
        assert_eq!(svix.check(), Ok(()));
        assert_eq!(svix.schedule().max_attempts(), 8);
        assert_eq!(svix.schedule().delays()[5], Duration::from_secs(36_000));
    }

    #[test]
    fn one_attempt_needs_no_delays_and_any_order_is_allowed() {
        assert_eq!(spec(1, &[]).check(), Ok(()));
        assert_eq!(spec(1, &[]).schedule().max_attempts(), 1);
        assert_eq!(spec(3, &[60, 5]).check(), Ok(()));
    }

    #[test]
    fn bad_specs_name_the_field() {
        let refused = |s: RetrySpec| s.check().unwrap_err().to_string();
        assert!(refused(spec(0, &[])).starts_with("retry.attempts"));
        assert!(refused(spec(21, &[1; 20])).starts_with("retry.attempts"));
        assert!(refused(spec(3, &[1])).starts_with("retry.delays must have attempts - 1 = 2"));
        assert!(refused(spec(3, &[1, 0])).starts_with("retry.delays[1]"));
        assert!(refused(spec(3, &[86_400 * 2, 86_400 + 1])).contains("at most 259200 s"));
        assert_eq!(spec(2, &[259_200]).check(), Ok(()), "the whole window may be one wait");
        assert!(refused(spec(2, &[u64::MAX])).contains("at most"));
    }

    #[test]
    fn an_update_that_does_not_name_retry_keeps_it_and_null_clears_it() {
        let old = spec(2, &[9]);
        assert_eq!(updated(&None, Some(&old)), Some(old.clone()));
        assert_eq!(updated(&Some(None), Some(&old)), None);
        assert_eq!(updated(&Some(Some(spec(1, &[]))), Some(&old)), Some(spec(1, &[])));
        assert_eq!(updated(&None, None), None);
    }

    #[test]
    fn null_and_absence_differ() {
        #[derive(Deserialize)]
        struct Input {
            #[serde(default, deserialize_with = "explicit_null")]
            retry: Option<Option<RetrySpec>>,
        }
        let parse = |text: &str| serde_json::from_str::<Input>(text).unwrap().retry;
        assert_eq!(parse("{}"), None);
        assert_eq!(parse(r#"{"retry": null}"#), Some(None));
        assert_eq!(parse(r#"{"retry": {"attempts": 2, "delays": [9]}}"#), Some(Some(spec(2, &[9]))));
        assert!(serde_json::from_str::<Input>(r#"{"retry": {"attempts": 2, "delay": [9]}}"#).is_err());
    }
}
