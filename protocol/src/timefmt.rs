//! RFC 3339 / ISO 8601 timestamps as the seed writes them (`2026-01-20T12:00:00Z`), plus millisecond epochs.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Formats a millisecond Unix epoch as RFC 3339 UTC with millisecond precision. Written digit by
/// digit: a job formats several of these, and `time`'s formatter with a `format!` after it showed
/// in the worker's profile. A year RFC 3339 cannot write gives `""`, as `time` did.
pub fn rfc3339_from_millis(epoch_ms: i64) -> String {
    let dt =
        OffsetDateTime::from_unix_timestamp_nanos(epoch_ms as i128 * 1_000_000).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let year = dt.year();
    if !(0..=9999).contains(&year) {
        return String::new();
    }
    let mut out = String::with_capacity(24);
    let mut digits = |n: u32, width: u32, after: char| {
        for place in (0..width).rev() {
            out.push(char::from(b'0' + (n / 10u32.pow(place) % 10) as u8));
        }
        out.push(after);
    };
    digits(year as u32, 4, '-');
    digits(u8::from(dt.month()).into(), 2, '-');
    digits(dt.day().into(), 2, 'T');
    digits(dt.hour().into(), 2, ':');
    digits(dt.minute().into(), 2, ':');
    digits(dt.second().into(), 2, '.');
    digits(dt.millisecond().into(), 3, 'Z');
    out
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

    /// What the function wrote before it was written digit by digit: `time`'s RFC 3339 form.
    fn reference(epoch_ms: i64) -> String {
        let dt = OffsetDateTime::from_unix_timestamp_nanos(epoch_ms as i128 * 1_000_000)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH);
        let ms = dt.millisecond();
        let secs = dt.replace_millisecond(0).unwrap_or(dt).format(&Rfc3339).unwrap_or_default();
        match secs.strip_suffix('Z') {
            Some(stem) => format!("{stem}.{ms:03}Z"),
            None => secs,
        }
    }

    #[test]
    fn writes_what_times_formatter_writes() {
        let edges = [0, 1, 999, 1_000, -1, -62_167_219_200_000, -62_167_219_200_001, 253_402_300_799_999];
        let past_9999 = 253_402_300_800_000;
        for ms in edges.into_iter().chain((0..2_000).map(|i| i * 7_919_993_117 + 13)).chain([past_9999]) {
            assert_eq!(rfc3339_from_millis(ms), reference(ms), "{ms}");
        }
        assert_eq!(rfc3339_from_millis(-62_167_219_200_001), "");
        // Past what `time` holds, the epoch stands in, as it did.
        assert_eq!(rfc3339_from_millis(past_9999), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn parses_the_seeds_second_precision_form() {
        assert_eq!(millis_from_rfc3339("2026-01-20T12:00:00Z"), Some(1_768_910_400_000));
        assert_eq!(millis_from_rfc3339("yesterday"), None);
    }
}
