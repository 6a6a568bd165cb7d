//! The worker's outgoing HTTP: one policy every client is built on (no redirect followed, no proxy,
//! bounded time, the fleet's trusted roots), and the callback client on top of it: a bounded body
//! and (unless private targets are allowed) a resolver that drops private addresses, so the address
//! actually connected to is always checked, DNS rebinding included.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use fleet_platform::tls::ClientTls;
use fleet_protocol::classify::TransportFailure;
use fleet_protocol::ssrf::{is_forbidden, permitted};

#[derive(Debug, thiserror::Error)]
#[error("{host} resolves only to loopback, private, link-local or metadata addresses")]
struct ForbiddenResolution {
    host: String,
}

struct GuardedResolver;

impl Resolve for GuardedResolver {
    // Boxed because reqwest's `Resolving` is a boxed future.
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let host = name.as_str().to_string();
            let allowed: Vec<SocketAddr> = permitted(tokio::net::lookup_host((host.as_str(), 0)).await?, false);
            if allowed.is_empty() {
                return Err(Box::new(ForbiddenResolution { host }) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// The settings every outgoing client of the worker starts from, declared once (the model client and
/// the callback client, which also carries webhooks, build on it).
///
/// No redirect is followed: a redirect re-sends the request, its body (a whole conversation) and
/// its `Authorization` header included, to an address the fleet never chose or checked. A 3xx
/// comes back as the answer it is. Proxy variables (HTTP(S)_PROXY, ALL_PROXY) are ignored: a proxy
/// connects wherever it likes, around the resolver's SSRF guard. HTTPS trusts `tls`'s roots
/// (bundled, `FLEET_TLS_CA_FILE`, and the system's if asked); no client certificate is ever sent.
pub fn outbound(timeout: Duration, tls: &ClientTls) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .user_agent(concat!("agent-fleet-worker/", env!("CARGO_PKG_VERSION")))
        .use_preconfigured_tls(tls.http_config())
}

/// The callback client and its policy.
#[derive(Clone)]
pub struct CallbackClient {
    client: reqwest::Client,
    allow_private: bool,
    max_body: usize,
    timeout: Duration,
}

/// A response read to its end (within the bound).
pub struct ReadResponse {
    pub status: u16,
    pub retry_after: Option<String>,
    pub location: Option<String>,
    pub body: bytes::Bytes,
}

impl CallbackClient {
    /// The [`outbound`] policy, and a pool sized for many callbacks to few tool owners.
    pub fn new(timeout: Duration, allow_private: bool, max_body: usize, tls: &ClientTls) -> Self {
        let mut builder = outbound(timeout, tls).pool_idle_timeout(Duration::from_secs(60)).pool_max_idle_per_host(64);
        if !allow_private {
            builder = builder.dns_resolver(Arc::new(GuardedResolver));
        }
        CallbackClient { client: builder.build().expect("the HTTP client builds"), allow_private, max_body, timeout }
    }

    /// Refuses a literal private address in `url` (names are filtered by the resolver instead).
    fn check_literal(&self, url: &reqwest::Url) -> Result<(), TransportFailure> {
        if self.allow_private {
            return Ok(());
        }
        let ip = match url.host() {
            Some(url::Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
            Some(url::Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
            _ => None,
        };
        match ip {
            Some(ip) if is_forbidden(ip) => {
                Err(TransportFailure::ForbiddenTarget(format!("{ip} is not a public address")))
            }
            _ => Ok(()),
        }
    }

    /// Sends a request built by `build` and reads the body up to the bound.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Result<ReadResponse, TransportFailure> {
        let request = request.build().map_err(|e| TransportFailure::Other(e.to_string()))?;
        self.check_literal(request.url())?;
        let mut response = self.client.execute(request).await.map_err(|e| transport_failure(e, self.timeout))?;
        let header = |name: reqwest::header::HeaderName| {
            response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
        };
        let retry_after = header(reqwest::header::RETRY_AFTER);
        let location = header(reqwest::header::LOCATION);
        let status = response.status().as_u16();
        if response.content_length().is_some_and(|len| len > self.max_body as u64) {
            return Err(TransportFailure::BodyTooLarge(self.max_body));
        }
        let mut body = bytes::BytesMut::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| transport_failure(e, self.timeout))? {
            if body.len() + chunk.len() > self.max_body {
                return Err(TransportFailure::BodyTooLarge(self.max_body));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(ReadResponse { status, retry_after, location, body: body.freeze() })
    }

    pub fn post(&self, url: impl reqwest::IntoUrl) -> reqwest::RequestBuilder {
        self.client.post(url)
    }

    pub fn get(&self, url: &str) -> reqwest::RequestBuilder {
        self.client.get(url)
    }
}

fn transport_failure(e: reqwest::Error, timeout: Duration) -> TransportFailure {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = source {
        if let Some(forbidden) = err.downcast_ref::<ForbiddenResolution>() {
            return TransportFailure::ForbiddenTarget(forbidden.to_string());
        }
        source = err.source();
    }
    if e.is_timeout() {
        TransportFailure::Timeout(timeout)
    } else if e.is_connect() {
        TransportFailure::Connect(root_cause(&e))
    } else {
        TransportFailure::Other(root_cause(&e))
    }
}

/// The innermost error message: reqwest's outer messages repeat the URL, which may hold tokens.
fn root_cause(e: &reqwest::Error) -> String {
    let mut last: &(dyn std::error::Error + 'static) = e;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}
