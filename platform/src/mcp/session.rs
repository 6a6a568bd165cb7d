//! One initialized MCP session over Streamable HTTP (rmcp's client), opened for a target.

use std::collections::HashMap;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{ClientInitializeError, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};

use super::error::{chain, failure_kind, scrub, FailureKind, McpError};
use super::McpServerTarget;

/// An initialized session: rmcp's running client, which owns its connection's tasks.
pub(crate) type Session = RunningService<RoleClient, ClientConfig>;

/// Headers rmcp sets itself: a target may not override them.
const RESERVED: [&str; 4] = ["accept", "mcp-session-id", "last-event-id", "mcp-protocol-version"];

/// Opens a session: the `initialize` handshake and its `initialized` notice, within `deadline`.
pub(crate) async fn open(target: &McpServerTarget, deadline: Duration) -> Result<Session, McpError> {
    match url::Url::parse(&target.url) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {}
        _ => return Err(bad_target(target, "the URL is not an http(s) URL")),
    }
    let config = StreamableHttpClientTransportConfig::with_uri(target.url.clone())
        .custom_headers(headers(target)?)
        .reinit_on_expired_session(true);
    let http = reqwest013::Client::builder()
        // A redirect could send the credentials elsewhere: MCP servers are called where they are.
        .redirect(reqwest013::redirect::Policy::none())
        .connect_timeout(deadline)
        .build()
        .map_err(|e| bad_target(target, &e.to_string()))?;
    let transport = StreamableHttpClientTransport::with_client(http, config);
    let info =
        ClientConfig::new(ClientCapabilities::default(), Implementation::new("fleet", env!("CARGO_PKG_VERSION")));
    match tokio::time::timeout(deadline, info.serve(transport)).await {
        Ok(Ok(session)) => Ok(session),
        Ok(Err(e)) => Err(init_error(target, &e)),
        Err(_) => Err(McpError::TimedOut { server: target.name.clone(), method: "initialize" }),
    }
}

/// The target's headers as HTTP headers, refusing what cannot be sent (without echoing values).
fn headers(target: &McpServerTarget) -> Result<HashMap<HeaderName, HeaderValue>, McpError> {
    let mut map = HashMap::new();
    for (name, value) in &target.headers {
        let header = HeaderName::try_from(name.as_str())
            .map_err(|_| bad_target(target, &format!("{name:?} is not a header name")))?;
        if RESERVED.contains(&header.as_str()) {
            return Err(bad_target(target, &format!("the header {name} is the MCP transport's own")));
        }
        let mut value = HeaderValue::try_from(value.as_str())
            .map_err(|_| bad_target(target, &format!("the value of the header {name} cannot be sent")))?;
        value.set_sensitive(true);
        map.insert(header, value);
    }
    Ok(map)
}

fn bad_target(target: &McpServerTarget, detail: &str) -> McpError {
    McpError::BadTarget { server: target.name.clone(), detail: scrub(detail, &target.secrets()) }
}

/// A failed handshake, sorted: nothing there, a refusal of the credentials, not MCP, an error.
fn init_error(target: &McpServerTarget, error: &ClientInitializeError) -> McpError {
    let server = target.name.clone();
    let secrets = target.secrets();
    // rmcp's transport error does not chain its cause: read from the transport's own error on.
    let cause: &(dyn std::error::Error + 'static) = match error {
        ClientInitializeError::JsonRpcError(data) => {
            return McpError::Rpc { server, method: "initialize", detail: scrub(&data.message, &secrets) };
        }
        ClientInitializeError::TransportError { error, .. } => error.error.as_ref(),
        other => other,
    };
    let detail = scrub(&chain(cause), &secrets);
    match failure_kind(cause) {
        FailureKind::Connect => McpError::Connect { server, detail },
        FailureKind::Unauthorized => McpError::Unauthorized { server },
        // During the handshake, any answer that is not its answer means the URL is no MCP server.
        FailureKind::NotMcp | FailureKind::Lost => McpError::NotMcp { server, detail },
    }
}
