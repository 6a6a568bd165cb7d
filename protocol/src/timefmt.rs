//! RFC 3339 / ISO 8601 timestamps as the seed writes them (`2026-01-20T12:00:00Z`), plus millisecond epochs.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Formats a millisecond Unix epoch as RFC 3339 UTC with millisecond precision.
pub fn rfc3339_from_millis(epoch_ms: i64) -> String {
    let dt =
        OffsetDateTime::from_unix_timestamp_nanos(epoch_ms as i128 * 1_000_000).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let ms = dt.millisecond();
    let secs = dt.replace_millisecond(0).unwrap_or(dt).format(&Rfc3339).unwrap_or_default();
    // `secs` ends in `Z`; insert the milliseconds before it.
    match secs.strip_suffix('Z') {
        Some(stem) => format!("{stem}.{ms:03}Z"),
        None => secs,
    }
}

/// Parses an RFC 3339 timestamp into a millisecond Unix epoch.
pub fn millis_from_rfc3339(text: &str) -> Option<i64> {
    let dt = OffsetDateTime::parse(text, &Rfc3339).ok()?;
    Some((dt.unix_timestamp_nanos() / 1_000_000) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_millisecond_precision() {
        let ms = 1_768_910_400_123; // 2026-01-20T12:00:00.123Z
        let text = rfc3339_from_millis(ms);
        assert_eq!(text, "2026-01-20T12:00:00.123Z");
        assert_eq!(millis_from_rfc3339(&text), Some(ms));
    }

    #[test]
    fn parses_the_seeds_second_precision_form() {
        assert_eq!(millis_from_rfc3339("2026-01-20T12:00:00Z"), Some(1_768_910_400_000));
        assert_eq!(millis_from_rfc3339("yesterday"), None);
    }
}
