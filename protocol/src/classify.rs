//! What a tool owner's HTTP answer (or the lack of one) means for the job: result, async, retry or give up.

use std::time::Duration;

/// The meaning of one callback response, per the seed's response table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseClass {
    /// 200/201 (and other 2xx but 202): the body's `result` is the tool result.
    Success,
    /// 202: the tool works asynchronously; poll its status URL.
    Accepted,
    /// Retry with backoff (408, 429, 5xx). `retry_after` may lengthen the wait.
    Retryable { retry_after: Option<Duration> },
    /// No retry (400, 401, 404, other 4xx, 3xx since redirects are not followed).
    Permanent,
}

/// Classifies a status code; `retry_after` is the raw `Retry-After` header, if any.
pub fn classify_status(status: u16, retry_after: Option<&str>, now_unix_secs: i64) -> ResponseClass {
    match status {
        202 => ResponseClass::Accepted,
        200..=299 => ResponseClass::Success,
        408 | 429 | 500..=599 => {
            ResponseClass::Retryable { retry_after: retry_after.and_then(|v| parse_retry_after(v, now_unix_secs)) }
        }
        300..=499 => ResponseClass::Permanent,
        // 1xx never reaches us as a final status; anything else is a broken peer: try again.
        _ => ResponseClass::Retryable { retry_after: None },
    }
}

/// Parses `Retry-After` as delta-seconds or an HTTP-date; a date in the past means no extra wait.
pub fn parse_retry_after(value: &str, now_unix_secs: i64) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    let when = when.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs() as i64;
    Some(Duration::from_secs((when - now_unix_secs).max(0) as u64))
}

/// The bounded label for a status, for metrics (`2xx`…`5xx`).
pub fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// Why an attempt got no usable HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportFailure {
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("connection failed: {0}")]
    Connect(String),
    #[error("response body exceeds the {0}-byte limit")]
    BodyTooLarge(usize),
    #[error("callback target refused: {0}")]
    ForbiddenTarget(String),
    #[error("request failed: {0}")]
    Other(String),
}

impl TransportFailure {
    /// A forbidden target will stay forbidden; every other transport failure may pass on retry.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, TransportFailure::ForbiddenTarget(_))
    }

    /// The bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            TransportFailure::Timeout(_) => "timeout",
            TransportFailure::Connect(_) => "network",
            TransportFailure::BodyTooLarge(_) => "too_large",
            TransportFailure::ForbiddenTarget(_) => "refused",
            TransportFailure::Other(_) => "network",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_response_table() {
        let c = |s| classify_status(s, None, 0);
        assert_eq!(c(200), ResponseClass::Success);
        assert_eq!(c(201), ResponseClass::Success);
        assert_eq!(c(202), ResponseClass::Accepted);
        for s in [400, 401, 403, 404, 409, 422] {
            assert_eq!(c(s), ResponseClass::Permanent, "{s}");
        }
        for s in [408, 429, 500, 502, 503, 504] {
            assert_eq!(c(s), ResponseClass::Retryable { retry_after: None }, "{s}");
        }
        assert_eq!(c(302), ResponseClass::Permanent, "redirects are not followed");
    }

    #[test]
    fn retry_after_in_both_forms() {
        assert_eq!(
            classify_status(429, Some("7"), 0),
            ResponseClass::Retryable { retry_after: Some(Duration::from_secs(7)) }
        );
        // Sun, 06 Nov 1994 08:49:37 GMT is 784111777.
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784_111_767), Some(Duration::from_secs(10)));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", 784_111_999), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", 0), None);
    }

    #[test]
    fn only_a_forbidden_target_is_final() {
        assert!(TransportFailure::Timeout(Duration::from_secs(30)).is_retryable());
        assert!(TransportFailure::BodyTooLarge(1).is_retryable());
        assert!(!TransportFailure::ForbiddenTarget("127.0.0.1".into()).is_retryable());
    }
}
