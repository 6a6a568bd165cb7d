//! Per-tool admission limits: `max_concurrency` (callbacks in flight to one tool across the fleet)
//! and `rate_limit` (`per_second`, `burst`: GCRA). What the API accepts, how an update changes
//! them, and the GCRA's numbers and its reference model (the Redis script is its atomic twin).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Bounds that keep the numbers meaningful (and the GCRA's arithmetic exact in doubles).
pub const MAX_CONCURRENCY_LIMIT: u64 = 100_000;
pub const MAX_PER_SECOND: f64 = 100_000.0;
/// One call per day at the slowest.
pub const MIN_PER_SECOND: f64 = 1.0 / 86_400.0;
pub const MAX_BURST: u64 = 100_000;

/// A tool's limits as stored; both optional (none: the seed's behaviour, no limit).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
}

impl ToolLimits {
    pub fn is_none(&self) -> bool {
        self.max_concurrency.is_none() && self.rate_limit.is_none()
    }
}

/// A tool's rate limit (GCRA): `per_second` on average, up to `burst` at once. Calls over it wait
/// in the broker without spending an attempt. (The API reads it with [`parse_rate_limit`].)
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Greater than 0 (from 1/86400, one a day, to 100000).
    #[cfg_attr(feature = "schema", schema(minimum = 0.000011575, maximum = 100000, example = 5))]
    pub per_second: f64,
    /// 1-100000; left out or null: 1.
    #[cfg_attr(feature = "schema", schema(value_type = Option<u32>, minimum = 1, maximum = 100000, example = 1))]
    pub burst: u32,
}

impl RateLimit {
    /// The GCRA's emission interval: one call per this many milliseconds.
    pub fn interval_ms(&self) -> f64 {
        1000.0 / self.per_second
    }

    /// The GCRA's tolerance: how far ahead of the schedule a call may run, `burst - 1` intervals.
    pub fn tolerance_ms(&self) -> f64 {
        f64::from(self.burst.saturating_sub(1)) * self.interval_ms()
    }
}

/// A field the API refused, with why; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LimitError(pub String);

/// The limits an update makes of `current`: a field left out keeps its value, `null` removes
/// the limit, anything else must be valid.
pub fn merge(
    current: &ToolLimits,
    max_concurrency: Option<&Value>,
    rate_limit: Option<&Value>,
) -> Result<ToolLimits, LimitError> {
    Ok(ToolLimits {
        max_concurrency: match max_concurrency {
            None => current.max_concurrency,
            Some(v) => parse_max_concurrency(v)?,
        },
        rate_limit: match rate_limit {
            None => current.rate_limit,
            Some(v) => parse_rate_limit(v)?,
        },
    })
}

/// `max_concurrency`: an integer from 1 to [`MAX_CONCURRENCY_LIMIT`], or `null` (no limit).
pub fn parse_max_concurrency(value: &Value) -> Result<Option<u32>, LimitError> {
    if value.is_null() {
        return Ok(None);
    }
    match value.as_u64() {
        Some(n) if (1..=MAX_CONCURRENCY_LIMIT).contains(&n) => Ok(Some(n as u32)),
        _ => Err(LimitError(format!(
            "max_concurrency must be an integer from 1 to {MAX_CONCURRENCY_LIMIT} (or null for no limit), not {}",
            excerpt(value)
        ))),
    }
}

/// `rate_limit`: `{"per_second": number > 0, "burst": integer ≥ 1}` (`burst` left out or `null`: 1), or
/// `null` (no limit).
pub fn parse_rate_limit(value: &Value) -> Result<Option<RateLimit>, LimitError> {
    let object = match value {
        Value::Null => return Ok(None),
        Value::Object(map) => map,
        other => {
            return Err(LimitError(format!(
                "rate_limit must be an object {{\"per_second\": number, \"burst\": integer}} (or null for no limit), not {}",
                excerpt(other)
            )))
        }
    };
    if let Some(unknown) = object.keys().find(|k| !matches!(k.as_str(), "per_second" | "burst")) {
        return Err(LimitError(format!("rate_limit has an unknown field {unknown:?} (it takes per_second and burst)")));
    }
    let per_second = match object.get("per_second").and_then(Value::as_f64) {
        Some(n) if n.is_finite() && (MIN_PER_SECOND..=MAX_PER_SECOND).contains(&n) => n,
        _ => {
            return Err(LimitError(format!(
                "rate_limit.per_second must be a number greater than 0 (from 1/86400 to {MAX_PER_SECOND})"
            )))
        }
    };
    let burst = match object.get("burst") {
        None | Some(Value::Null) => 1,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_BURST).contains(&n) => n as u32,
            _ => return Err(LimitError(format!("rate_limit.burst must be an integer from 1 to {MAX_BURST}"))),
        },
    };
    Ok(Some(RateLimit { per_second, burst }))
}

fn excerpt(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(40) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// The GCRA with reservations, as a plain function (the Redis script does the same atomically):
/// a call arriving at `now` is given the slot `max(now, tat - tolerance)` and moves the
/// theoretical arrival time to `max(tat, now) + interval`. A call whose slot is later than `now`
/// keeps it (the caller holds a reservation and comes back then), so calls waiting on a backlog are
/// spaced by the interval instead of all retrying at once for the same free slot.
/// Returns (its slot, the new `tat`); all in milliseconds.
pub fn gcra_reserve(limit: &RateLimit, tat: Option<f64>, now: f64) -> (f64, f64) {
    let tat = tat.unwrap_or(now).max(now);
    let slot = (tat - limit.tolerance_ms()).max(now);
    (slot, tat + limit.interval_ms())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn limits_parse_and_name_their_field() {
        assert_eq!(parse_max_concurrency(&json!(2)), Ok(Some(2)));
        assert_eq!(parse_max_concurrency(&Value::Null), Ok(None));
        for bad in [json!(0), json!(-1), json!(1.5), json!("2"), json!(100_001), json!({})] {
            let e = parse_max_concurrency(&bad).unwrap_err();
            assert!(e.0.starts_with("max_concurrency must be"), "{bad}: {e}");
        }
        assert_eq!(
            parse_rate_limit(&json!({"per_second": 5, "burst": 1})),
            Ok(Some(RateLimit { per_second: 5.0, burst: 1 }))
        );
        assert_eq!(parse_rate_limit(&json!({"per_second": 0.5})), Ok(Some(RateLimit { per_second: 0.5, burst: 1 })));
        assert_eq!(
            parse_rate_limit(&json!({"per_second": 2, "burst": null})),
            Ok(Some(RateLimit { per_second: 2.0, burst: 1 }))
        );
        assert_eq!(parse_rate_limit(&Value::Null), Ok(None));
        let cases = [
            (json!(5), "rate_limit must be an object"),
            (json!({}), "rate_limit.per_second"),
            (json!({"per_second": 0}), "rate_limit.per_second"),
            (json!({"per_second": -1}), "rate_limit.per_second"),
            (json!({"per_second": "5"}), "rate_limit.per_second"),
            (json!({"per_second": 1e9}), "rate_limit.per_second"),
            (json!({"per_second": 5, "burst": 0}), "rate_limit.burst"),
            (json!({"per_second": 5, "burst": 1.5}), "rate_limit.burst"),
            (json!({"per_second": 5, "burts": 2}), "rate_limit has an unknown field \"burts\""),
        ];
        for (bad, start) in cases {
            let e = parse_rate_limit(&bad).unwrap_err();
            assert!(e.0.starts_with(start), "{bad}: {e}");
        }
    }

    #[test]
    fn an_update_keeps_what_it_leaves_out_and_null_removes() {
        let current =
            ToolLimits { max_concurrency: Some(3), rate_limit: Some(RateLimit { per_second: 2.0, burst: 4 }) };
        assert_eq!(merge(&current, None, None).unwrap(), current);
        let changed = merge(&current, Some(&json!(5)), Some(&Value::Null)).unwrap();
        assert_eq!(changed, ToolLimits { max_concurrency: Some(5), rate_limit: None });
        assert!(merge(&current, Some(&Value::Null), Some(&Value::Null)).unwrap().is_none());
        assert!(merge(&current, Some(&json!(0)), None).is_err());
    }

    #[test]
    fn stored_limits_round_trip_and_absent_ones_take_no_room() {
        assert_eq!(serde_json::to_value(ToolLimits::default()).unwrap(), json!({}));
        let limits = ToolLimits { max_concurrency: Some(2), rate_limit: Some(RateLimit { per_second: 5.0, burst: 1 }) };
        let text = serde_json::to_string(&limits).unwrap();
        assert_eq!(serde_json::from_str::<ToolLimits>(&text).unwrap(), limits);
        assert_eq!(serde_json::from_str::<ToolLimits>("{}").unwrap(), ToolLimits::default());
    }

    #[test]
    fn a_backlog_is_spaced_by_the_interval_after_its_burst() {
        let limit = RateLimit { per_second: 5.0, burst: 3 };
        assert_eq!((limit.interval_ms(), limit.tolerance_ms()), (200.0, 400.0));
        let mut tat = None;
        let slots: Vec<f64> = (0..6)
            .map(|_| {
                let (slot, next) = gcra_reserve(&limit, tat, 1_000.0);
                tat = Some(next);
                slot - 1_000.0
            })
            .collect();
        assert_eq!(slots, [0.0, 0.0, 0.0, 200.0, 400.0, 600.0], "burst of 3, then one per 200 ms");
    }

    #[test]
    fn an_idle_limiter_forgets_its_past() {
        let limit = RateLimit { per_second: 5.0, burst: 1 };
        let (slot, tat) = gcra_reserve(&limit, Some(500.0), 10_000.0);
        assert_eq!((slot, tat), (10_000.0, 10_200.0));
        // Calls spread wider than the interval all run at once.
        let (slot, _) = gcra_reserve(&limit, Some(tat), 10_250.0);
        assert_eq!(slot, 10_250.0);
    }

    #[test]
    fn the_long_run_rate_is_per_second() {
        // 10 s of a steady backlog at 5/s, burst 1: 50 slots from the first one.
        let limit = RateLimit { per_second: 5.0, burst: 1 };
        let mut tat = None;
        let mut slots = vec![];
        for _ in 0..200 {
            let (slot, next) = gcra_reserve(&limit, tat, 0.0);
            tat = Some(next);
            slots.push(slot);
        }
        assert_eq!(slots.iter().filter(|s| **s < 10_000.0).count(), 50);
    }
}
