//! Why an MCP request failed, in words that are safe to store: sanitised, header values removed,
//! and sorted by what the caller may do next (retry at once, reconcile, fix the target).

use std::error::Error as StdError;

use fleet_protocol::mcp::DiscoveryError;
use fleet_protocol::sanitize::sanitize_error;
use rmcp::transport::streamable_http_client::StreamableHttpError;

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

    /// One line without the cause's detail (which may name URLs): what a result's error says.
    pub fn summary(&self) -> String {
        let server = self.server();
        match self {
            McpError::BadTarget { .. } => format!("MCP server {server} is not configured right"),
            McpError::Connect { .. } => format!("MCP server {server} could not be reached"),
            McpError::NotMcp { .. } => format!("MCP server {server} does not answer as an MCP server"),
            McpError::Unauthorized { .. } => format!("MCP server {server} refused the credentials"),
            McpError::Rpc { method, .. } => format!("MCP server {server} answered {method} with an error"),
            McpError::Lost { method, .. } => format!("MCP server {server}: the connection was lost during {method}"),
            McpError::TimedOut { method, .. } => format!("MCP server {server} did not answer {method} in time"),
            McpError::Discovery { .. } => format!("MCP server {server} lists its tools against the rules"),
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
    let mut source = next_cause(error);
    while let Some(e) = source {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = next_cause(e);
    }
    parts.join(": ")
}

/// An error's cause, also through rmcp's HTTP client error, which does not name its cause.
fn next_cause<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a (dyn StdError + 'static)> {
    match error.downcast_ref::<HttpError>() {
        Some(StreamableHttpError::Client(inner)) => Some(inner),
        _ => error.source(),
    }
}

/// What a transport failure says about the server.
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

/// The transport's error type, as rmcp's reqwest client reports it.
type HttpError = StreamableHttpError<reqwest013::Error>;

/// Sorts a failure by the first of its causes that says: rmcp's HTTP error, or an `io::Error`.
/// rmcp's errors do not always chain their causes: `start` is where the chain is whole.
pub(crate) fn failure_kind(start: &(dyn StdError + 'static)) -> FailureKind {
    let mut source: Option<&(dyn StdError + 'static)> = Some(start);
    while let Some(e) = source {
        if let Some(http) = e.downcast_ref::<HttpError>() {
            return http_kind(http);
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(io.kind(), ConnectionRefused | AddrNotAvailable | HostUnreachable | NetworkUnreachable) {
                return FailureKind::Connect;
            }
        }
        source = e.source();
    }
    FailureKind::Lost
}

fn http_kind(error: &HttpError) -> FailureKind {
    match error {
        StreamableHttpError::Client(e) if e.is_connect() || e.is_builder() => FailureKind::Connect,
        StreamableHttpError::AuthRequired(_) | StreamableHttpError::InsufficientScope(_) => FailureKind::Unauthorized,
        // A 401 or 403 without a challenge keeps its status in the text (rmcp's own wording).
        StreamableHttpError::UnexpectedServerResponse(text)
            if text.starts_with("HTTP 401") || text.starts_with("HTTP 403") =>
        {
            FailureKind::Unauthorized
        }
        StreamableHttpError::UnexpectedServerResponse(_)
        | StreamableHttpError::UnexpectedContentType(_)
        | StreamableHttpError::Deserialize(_)
        | StreamableHttpError::MissingSessionIdInResponse
        | StreamableHttpError::ResponseBodyTooLarge { .. }
        | StreamableHttpError::ServerDoesNotSupportSse => FailureKind::NotMcp,
        _ => FailureKind::Lost,
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
    fn failures_are_sorted_by_their_cause() {
        let html = HttpError::UnexpectedContentType(Some("text/html".into()));
        assert_eq!(failure_kind(&html), FailureKind::NotMcp);
        let denied = HttpError::UnexpectedServerResponse("HTTP 401 Unauthorized: no".into());
        assert_eq!(failure_kind(&denied), FailureKind::Unauthorized);
        assert_eq!(failure_kind(&HttpError::UnexpectedEndOfStream), FailureKind::Lost);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(failure_kind(&refused), FailureKind::Connect);
        // A port that spells a status is no status.
        let lost = std::io::Error::other("reset by http://127.0.0.1:40123/mcp");
        assert_eq!(failure_kind(&lost), FailureKind::Lost);
    }

    #[test]
    fn only_unsent_failures_are_safe_to_retry() {
        let connect = McpError::Connect { server: "s".into(), detail: "refused".into() };
        let lost = McpError::Lost { server: "s".into(), method: "tools/call", detail: "reset".into() };
        assert!(connect.unsent());
        assert!(!lost.unsent());
        assert_eq!(lost.server(), "s");
        assert_eq!(lost.summary(), "MCP server s: the connection was lost during tools/call");
    }
}
