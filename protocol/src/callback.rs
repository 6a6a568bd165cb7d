//! The signed callback a tool owner receives: the seed's body, field for field, and its headers.

use serde::Serialize;
use serde_json::Value;

pub const SIGNATURE_HEADER: &str = "X-Interactor-Signature";
pub const TIMESTAMP_HEADER: &str = "X-Interactor-Timestamp";
pub const REQUEST_ID_HEADER: &str = "X-Interactor-Request-Id";

/// Tool callback timeout (seed: 30 s).
pub const TOOL_CALLBACK_TIMEOUT_SECS: u64 = 30;
/// How long a 202 (async) callback is polled before the attempt times out (seed: 5 minutes).
pub const ASYNC_POLL_LIMIT_SECS: u64 = 5 * 60;
/// Largest response body read from a tool owner.
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// `POST callback_url` body, in the seed's field order.
#[derive(Debug, Serialize)]
pub struct CallbackBody<'a> {
    pub tool_name: &'a str,
    pub parameters: &'a Value,
    pub execution_id: &'a str,
    pub room_id: Option<&'a str>,
    pub assistant_id: Option<&'a str>,
    /// The signing time, ISO 8601 (the same value as the timestamp header).
    pub timestamp: &'a str,
}

impl CallbackBody<'_> {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a callback body always serialises")
    }
}

/// Where a 202 answer says to poll: `status_url` (or `poll_url`) in the body, else `Location`.
pub fn async_status_url(body: &Value, location: Option<&str>) -> Option<String> {
    ["status_url", "poll_url"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_str))
        .or(location)
        .map(str::to_string)
}

/// A 202's status URL made absolute: a relative reference (`/jobs/1`, `status/1`) is resolved
/// against the callback URL, as a browser resolves a link. Only http(s) results are usable.
pub fn resolve_status_url(callback_url: &str, reference: &str) -> Result<String, String> {
    let base = url::Url::parse(callback_url).map_err(|e| format!("callback URL is not a URL: {e}"))?;
    let resolved = base.join(reference.trim()).map_err(|e| format!("status URL cannot be resolved: {e}"))?;
    match resolved.scheme() {
        "http" | "https" => Ok(resolved.to_string()),
        other => Err(format!("status URL must be http(s), got {other}:")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn body_has_the_seeds_fields_in_order() {
        let params = json!({"query": "laptop"});
        let body = CallbackBody {
            tool_name: "search_products",
            parameters: &params,
            execution_id: "exec_xyz",
            room_id: Some("room_xyz"),
            assistant_id: Some("asst_abc"),
            timestamp: "2026-01-20T12:00:00Z",
        };
        assert_eq!(
            String::from_utf8(body.to_bytes()).unwrap(),
            r#"{"tool_name":"search_products","parameters":{"query":"laptop"},"execution_id":"exec_xyz","room_id":"room_xyz","assistant_id":"asst_abc","timestamp":"2026-01-20T12:00:00Z"}"#
        );
    }

    #[test]
    fn status_url_from_body_or_location() {
        assert_eq!(async_status_url(&json!({"status_url": "http://a/s"}), Some("http://b")), Some("http://a/s".into()));
        assert_eq!(async_status_url(&json!({}), Some("http://b")), Some("http://b".into()));
        assert_eq!(async_status_url(&json!(null), None), None);
    }

    #[test]
    fn relative_status_urls_resolve_against_the_callback_url() {
        let base = "https://tools.example.com/hooks/search?x=1";
        assert_eq!(resolve_status_url(base, "/jobs/7").unwrap(), "https://tools.example.com/jobs/7");
        assert_eq!(resolve_status_url(base, "status/7").unwrap(), "https://tools.example.com/hooks/status/7");
        assert_eq!(resolve_status_url(base, "../s/7?t=1").unwrap(), "https://tools.example.com/s/7?t=1");
        assert_eq!(resolve_status_url(base, "//other.example/s").unwrap(), "https://other.example/s");
        assert_eq!(resolve_status_url(base, "http://abs.example/s").unwrap(), "http://abs.example/s");
        assert!(resolve_status_url(base, "ftp://files.example/s").is_err());
        assert!(resolve_status_url("not a url", "/s").is_err());
    }
}
