//! Why an MCP request failed, in words that are safe to store: sanitised, header values removed,
//! and sorted by what the caller may do next (retry at once, reconcile, fix the target).

use std::error::Error as StdError;

use fleet_protocol::mcp::DiscoveryError;
use fleet_protocol::sanitize::sanitize_error;

/// An MCP client failure. Every message is sanitised and never holds a header value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    /// The target itself is unusable (a URL that is not http(s), a header that cannot be sent).
    #[error("MCP server {server}: bad target: {detail}")]
    BadTarget { server: String, detail: String },
    /// Nothing answered at the URL (refused, unreachable, no DNS name, TLS failed).
    #[error("MCP server {server}: cannot connect: {detail}")]
    Connect { server: String, detail: String },
    /// Something answered, but not as an MCP server (an HTML page, a 404, garbage).
    #[error("MCP server {server}: the URL does not answer as an MCP server (Streamable HTTP): {detail}")]
    NotMcp { server: String, detail: String },
    /// The server refused the credentials (401 or 403).
    #[error("MCP server {server}: not authorized (HTTP 401/403): check its headers")]
    Unauthorized { server: String },
    /// The server answered the handshake or a request with a JSON-RPC error.
    #[error("MCP server {server}: {method} answered an error: {detail}")]
    Rpc { server: String, method: &'static str, detail: String },
    /// The connection was lost, or the answer could not be read, after the request went out.
    #[error("MCP server {server}: {method}: the connection was lost before an answer: {detail}")]
    Lost { server: String, method: &'static str, detail: String },
    #[error("MCP server {server}: {method} did not answer in time")]
    TimedOut { server: String, method: &'static str },
    /// The listing broke a discovery rule (budget, cursor, name, schema).
    #[error("MCP server {server}: {source}")]
    Discovery { server: String, source: DiscoveryError },
}

impl McpError {
    pub fn server(&self) -> &str {
        match self {
            McpError::BadTarget { server, .. }
            | McpError::Connect { server, .. }
            | McpError::NotMcp { server, .. }
            | McpError::Unauthorized { server }
            | McpError::Rpc { server, .. }
            | McpError::Lost { server, .. }
            | McpError::TimedOut { server, .. }
            | McpError::Discovery { server, .. } => server,
        }
    }

    /// Whether the request surely never reached the server (so trying again is safe).
    pub fn unsent(&self) -> bool {
        matches!(self, McpError::BadTarget { .. } | McpError::Connect { .. } | McpError::Unauthorized { .. })
    }
}

/// Text fit for an error: every secret (header value) replaced, then sanitised to one line.
pub(crate) fn scrub(text: &str, secrets: &[String]) -> String {
    let mut text = text.to_string();
    for secret in secrets.iter().filter(|s| s.len() >= 4) {
        text = text.replace(secret.as_str(), "****");
    }
    sanitize_error(&text)
}

/// The whole chain of an error as one line (rmcp's outer messages rarely say the cause).
pub(crate) fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut parts = vec![error.to_string()];
    let mut source = error.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = e.source();
    }
    parts.join(": ")
}

/// What a transport failure says about the server, read from its text and its causes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureKind {
    /// No connection was made: the request never left.
    Connect,
    Unauthorized,
    /// The server answered with something that is not MCP.
    NotMcp,
    /// Anything else after the request went out.
    Lost,
}

/// Sorts a failure by its error chain. Connection errors are found by their `io::Error` kind;
/// the rest by rmcp's own wording (its types are not all public).
pub(crate) fn failure_kind(error: &(dyn StdError + 'static)) -> FailureKind {
    let mut source: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(io.kind(), ConnectionRefused | AddrNotAvailable | HostUnreachable | NetworkUnreachable) {
                return FailureKind::Connect;
            }
        }
        source = e.source();
    }
    classify_text(&chain(error))
}

/// The wording half of [`failure_kind`], apart so it can be tested.
fn classify_text(text: &str) -> FailureKind {
    let lower = text.to_ascii_lowercase();
    let any = |words: &[&str]| words.iter().any(|w| lower.contains(w));
    if any(&["auth required", "authrequired", "insufficient scope", "401", "403", "unauthorized", "forbidden"]) {
        FailureKind::Unauthorized
    } else if any(&["error trying to connect", "connection refused", "dns error", "failed to lookup", "tcp connect"]) {
        FailureKind::Connect
    } else if any(&[
        "unexpected content type",
        "unexpected server response",
        "content-type",
        "content type",
        "404",
        "405",
        "expect initialized",
        "deserialize",
        "parse",
        "missing session id",
        "invalid",
    ]) {
        FailureKind::NotMcp
    } else {
        FailureKind::Lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_never_reach_an_error() {
        let secrets = vec!["Bearer s3cr3t-token".to_string(), "s3cr3t-token".to_string()];
        let text = scrub("refused: Authorization: Bearer s3cr3t-token\nat line 2", &secrets);
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(!text.contains('\n'));
    }

    #[test]
    fn failures_are_sorted_by_their_words() {
        assert_eq!(classify_text("Auth required, WWW-Authenticate: Bearer"), FailureKind::Unauthorized);
        assert_eq!(classify_text("error sending request: error trying to connect"), FailureKind::Connect);
        assert_eq!(classify_text("Unexpected content type: Some(\"text/html\")"), FailureKind::NotMcp);
        assert_eq!(classify_text("stream ended"), FailureKind::Lost);
    }

    #[test]
    fn only_unsent_failures_are_safe_to_retry() {
        let connect = McpError::Connect { server: "s".into(), detail: "refused".into() };
        let lost = McpError::Lost { server: "s".into(), method: "tools/call", detail: "reset".into() };
        assert!(connect.unsent());
        assert!(!lost.unsent());
        assert_eq!(lost.server(), "s");
    }
}
