//! Request validation as plain functions: body parsing (400 vs 422), names, URLs and sizes.

use std::net::IpAddr;

use serde::de::DeserializeOwned;
use url::Url;

use crate::error::ApiError;

/// Parses a JSON body: not JSON is 400 (malformed), JSON of the wrong shape is 422 naming the field.
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::malformed("request body is empty; a JSON object is required"));
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::malformed(format!("request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid("request body must be a JSON object"));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." {
            ApiError::invalid(inner)
        } else {
            ApiError::invalid(format!("{path}: {inner}"))
        }
    })
}

/// Tool names follow the OpenAI function-name rule: 1–64 of `[A-Za-z0-9_-]`.
pub fn tool_name(name: &str) -> Result<(), ApiError> {
    if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(ApiError::invalid(format!(
            "tool name {:?} must be 1-64 characters of letters, digits, '_' or '-'",
            truncate(name, 80)
        )));
    }
    Ok(())
}

/// A tool name a call may name: a registered tool's, or an MCP server's tool's (`server.tool`).
pub fn called_tool_name(name: &str) -> Result<(), ApiError> {
    if fleet_protocol::tools::is_callable_tool_name(name) {
        return Ok(());
    }
    tool_name(name)
}

/// An optional identifier field (`room_id`, `assistant_id`): at most 256 characters, no control characters.
pub fn identifier(field: &str, value: Option<&str>) -> Result<(), ApiError> {
    match value {
        Some(v) if v.is_empty() || v.chars().count() > 256 || v.chars().any(char::is_control) => {
            Err(ApiError::invalid(format!("{field} must be 1-256 characters without control characters")))
        }
        _ => Ok(()),
    }
}

/// A callback URL: absolute http(s) with a host, no credentials; with private targets refused, a
/// literal private address or `localhost` is refused here (names are checked again on resolve and
/// at connect time by the worker).
pub fn callback_url(field: &str, raw: &str, allow_private: bool) -> Result<Url, ApiError> {
    if raw.len() > 2048 {
        return Err(ApiError::invalid(format!("{field} is longer than 2048 characters")));
    }
    // URL parsing drops tabs and line breaks silently: the URL stored would not be the one parsed.
    if raw.chars().any(char::is_control) {
        return Err(ApiError::invalid(format!("{field} must not contain control characters (CR, LF, tab)")));
    }
    let url = Url::parse(raw).map_err(|e| ApiError::invalid(format!("{field} is not a valid URL: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(ApiError::invalid(format!("{field} must use http or https")));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ApiError::invalid(format!("{field} must not carry credentials")));
    }
    let host =
        url.host_str().filter(|h| !h.is_empty()).ok_or_else(|| ApiError::invalid(format!("{field} has no host")))?;
    if !allow_private && host_is_private(host) {
        return Err(ApiError::invalid(format!(
            "{field} targets a loopback, private, link-local or metadata address, which is not allowed"
        )));
    }
    Ok(url)
}

/// Whether a URL host (as `Url` prints it) is a private literal address or a local name.
pub fn host_is_private(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(ip) => fleet_protocol::ssrf::is_forbidden(ip),
        Err(_) => {
            let lower = bare.trim_end_matches('.').to_ascii_lowercase();
            lower == "localhost" || lower.ends_with(".localhost") || lower.ends_with(".internal")
        }
    }
}

/// An `Idempotency-Key` header: 1–255 visible ASCII characters.
pub fn idempotency_key(raw: &str) -> Result<(), ApiError> {
    if raw.is_empty() || raw.len() > 255 || !raw.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(ApiError::malformed("Idempotency-Key must be 1-255 visible ASCII characters"));
    }
    Ok(())
}

fn truncate(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// A registry entry's `retry`, if given (`null` is fine: back to the default): 422 naming the field.
pub fn retry(retry: &Option<Option<fleet_protocol::retry_spec::RetrySpec>>) -> Result<(), ApiError> {
    match retry {
        Some(Some(spec)) => spec.check().map_err(|e| ApiError::invalid(e.to_string())),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn a_callback_url_with_a_line_break_or_tab_is_refused() {
        for raw in ["https://a.example/x\r\nX-Injected: 1", "https://a.example/\tx", "https://a.example/x\n"] {
            let e = callback_url("callback_url", raw, false).unwrap_err();
            assert!(e.message.contains("control characters"), "{raw:?}: {}", e.message);
        }
        assert!(callback_url("callback_url", "https://a.example/x", false).is_ok());
    }

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Sample {
        tool_name: String,
        parameters: serde_json::Map<String, serde_json::Value>,
    }

    #[test]
    fn malformed_is_400_and_wrong_shape_is_422_naming_the_field() {
        let e = parse_body::<Sample>(b"{not json").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e = parse_body::<Sample>(br#"{"tool_name": 5, "parameters": {}}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.message.starts_with("tool_name:"), "{}", e.message);
        let e = parse_body::<Sample>(br#"{"tool_name": "x"}"#).unwrap_err();
        assert!(e.message.contains("parameters"), "{}", e.message);
        let e = parse_body::<Sample>(b"[1]").unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(parse_body::<Sample>(b"").unwrap_err().status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn urls_are_checked_for_shape_and_private_targets() {
        assert!(callback_url("callback_url", "https://tools.example.com/x", false).is_ok());
        for bad in ["ftp://x/y", "not a url", "https://user:pw@example.com/", "http://", "mailto:a@b.c"] {
            assert!(callback_url("callback_url", bad, false).is_err(), "{bad}");
        }
        for private in [
            "http://127.0.0.1:9/x",
            "http://localhost/x",
            "http://[::1]/",
            "http://169.254.169.254/latest",
            "http://10.0.0.8/",
            "http://[::ffff:127.0.0.1]/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://017700000001/",
        ] {
            let e = callback_url("callback_url", private, false).unwrap_err();
            assert!(e.message.contains("not allowed"), "{private}: {}", e.message);
            assert!(
                callback_url("callback_url", private, true).is_ok(),
                "{private} allowed when private targets are on"
            );
        }
    }

    #[test]
    fn names_and_keys() {
        assert!(tool_name("search_products").is_ok());
        assert!(tool_name("").is_err());
        assert!(tool_name("a b").is_err());
        assert!(tool_name(&"x".repeat(65)).is_err());
        assert!(idempotency_key("order-42").is_ok());
        assert!(idempotency_key("has space").is_err());
        assert!(identifier("room_id", Some("room\n1")).is_err());
        assert!(identifier("room_id", None).is_ok());
    }
}
