//! Where a data source may be reached: its host resolved, and the callbacks' private-address policy
//! (`fleet_protocol::ssrf::permitted`) applied to the addresses actually connected to, so a name
//! that resolves (or rebinds) to a private address is refused too.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use fleet_protocol::ssrf::permitted;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use tokio::net::TcpStream;

use super::error::DataSourceError;

/// The addresses `host:port` may be connected to under the policy, resolved within `deadline`.
pub(crate) async fn resolve(
    host: &str,
    port: u16,
    allow_private: bool,
    deadline: Duration,
) -> Result<Vec<SocketAddr>, DataSourceError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let found: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => match tokio::time::timeout(deadline, tokio::net::lookup_host((bare, port))).await {
            Ok(Ok(addrs)) => addrs.collect(),
            Ok(Err(e)) => return Err(DataSourceError::Unreachable(format!("cannot resolve {bare}: {e}"))),
            Err(_) => return Err(DataSourceError::Unreachable(format!("resolving {bare} took too long"))),
        },
    };
    if found.is_empty() {
        return Err(DataSourceError::Unreachable(format!("{bare} has no address")));
    }
    let allowed = permitted(found, allow_private);
    if allowed.is_empty() {
        return Err(DataSourceError::PrivateAddress { host: bare.to_string() });
    }
    Ok(allowed)
}

/// A TCP connection to the first of `addrs` that answers within `deadline` (shared by all).
pub(crate) async fn connect(addrs: &[SocketAddr], deadline: Duration) -> Result<TcpStream, DataSourceError> {
    let attempt = async {
        let mut last = None;
        for addr in addrs {
            match TcpStream::connect(addr).await {
                Ok(stream) => {
                    // Queries are small request-answer exchanges: Nagle's delay would only add latency.
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Err(e) => last = Some(format!("{addr}: {e}")),
            }
        }
        Err(DataSourceError::Unreachable(last.unwrap_or_else(|| "no address to connect to".into())))
    };
    match tokio::time::timeout(deadline, attempt).await {
        Ok(connected) => connected,
        Err(_) => Err(no_answer(deadline)),
    }
}

/// Nothing answered within the connect timeout.
pub(crate) fn no_answer(deadline: Duration) -> DataSourceError {
    DataSourceError::Unreachable(format!("no answer within the connect timeout of {} ms", deadline.as_millis()))
}

/// Refuses a URL host that is a literal private address (reqwest resolves no literal, so the
/// resolver below never sees it).
pub(crate) fn check_literal(host: Option<url::Host<&str>>, allow_private: bool) -> Result<(), DataSourceError> {
    let ip = match host {
        Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
        Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
        _ => return Ok(()),
    };
    match permitted([SocketAddr::new(ip, 0)], allow_private).is_empty() {
        true => Err(DataSourceError::PrivateAddress { host: ip.to_string() }),
        false => Ok(()),
    }
}

/// A REST source's DNS resolver: the same policy on every name its client resolves.
pub(crate) struct PolicyResolver {
    pub(crate) allow_private: bool,
}

/// A name whose addresses the policy refuses, found in a request's error chain.
#[derive(Debug, thiserror::Error)]
#[error("{host} resolves only to loopback, private, link-local or metadata addresses")]
pub(crate) struct RefusedHost {
    pub(crate) host: String,
}

impl PolicyResolver {
    pub(crate) fn shared(allow_private: bool) -> Arc<Self> {
        Arc::new(PolicyResolver { allow_private })
    }
}

impl Resolve for PolicyResolver {
    // Boxed because reqwest's `Resolving` is a boxed future.
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private = self.allow_private;
        Box::pin(async move {
            let host = name.as_str().to_string();
            let allowed = permitted(tokio::net::lookup_host((host.as_str(), 0)).await?, allow_private);
            if allowed.is_empty() {
                return Err(Box::new(RefusedHost { host }) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn private_hosts_are_refused_unless_allowed() {
        let wait = Duration::from_secs(5);
        for host in ["127.0.0.1", "localhost", "[::1]", "169.254.169.254", "10.1.2.3"] {
            let refused = resolve(host, 5432, false, wait).await.unwrap_err();
            assert_eq!(refused.code(), "private_address", "{host}: {refused}");
        }
        let allowed = resolve("127.0.0.1", 5432, true, wait).await.unwrap();
        assert_eq!(allowed, vec!["127.0.0.1:5432".parse().unwrap()]);
        assert!(check_literal(Some(url::Host::Ipv4([127, 0, 0, 1].into())), false).is_err());
        assert!(check_literal(Some(url::Host::Ipv4([127, 0, 0, 1].into())), true).is_ok());
        assert!(check_literal(Some(url::Host::Domain("example.com")), false).is_ok());
    }
}
