//! Where a data source may be reached: its host resolved, and the callbacks' private-address policy
//! (`fleet_protocol::ssrf::is_forbidden`) applied to the addresses actually connected to, so a name
//! that resolves (or rebinds) to a private address is refused too, but for the private networks an
//! operator allows ([`PrivateNetworks`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use fleet_protocol::ssrf::is_forbidden;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use tokio::net::TcpStream;

use super::error::DataSourceError;

/// The private networks a data source may be reached on, beside every public address: none (the
/// default), the networks an operator lists (`FLEET_DATA_SOURCE_NETWORKS`: the database's subnet,
/// without opening callbacks to it), or all of them (`FLEET_ALLOW_PRIVATE_CALLBACKS`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PrivateNetworks {
    all: bool,
    listed: Vec<ipnet::IpNet>,
}

impl PrivateNetworks {
    /// Every private network (loopback and metadata addresses too).
    pub fn all() -> Self {
        PrivateNetworks { all: true, listed: vec![] }
    }

    /// A comma-separated list of networks in CIDR form (`10.20.0.0/16, fd00:db::/64`); a bare
    /// address is a network of its own. Empty: none.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut listed = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let net = match item.parse::<ipnet::IpNet>() {
                Ok(net) => net,
                Err(_) => item
                    .parse::<IpAddr>()
                    .map(ipnet::IpNet::from)
                    .map_err(|_| format!("{item:?} is neither a network in CIDR form (10.0.0.0/8) nor an address"))?,
            };
            listed.push(net.trunc());
        }
        Ok(PrivateNetworks { all: false, listed })
    }

    /// These networks, or all of them when `all`.
    pub fn or_all(self, all: bool) -> Self {
        PrivateNetworks { all: self.all || all, ..self }
    }

    /// Whether `ip` may be connected to: public, or in an allowed network.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.all || !is_forbidden(ip) || self.listed.iter().any(|net| net.contains(&ip))
    }

    fn filter(&self, addrs: impl IntoIterator<Item = SocketAddr>) -> Vec<SocketAddr> {
        addrs.into_iter().filter(|a| self.permits(a.ip())).collect()
    }
}

/// The addresses `host:port` may be connected to under the policy, resolved within `deadline`.
pub(crate) async fn resolve(
    host: &str,
    port: u16,
    private: &PrivateNetworks,
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
    let allowed = private.filter(found);
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
pub(crate) fn check_literal(host: Option<url::Host<&str>>, private: &PrivateNetworks) -> Result<(), DataSourceError> {
    let ip = match host {
        Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
        Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
        _ => return Ok(()),
    };
    match private.permits(ip) {
        false => Err(DataSourceError::PrivateAddress { host: ip.to_string() }),
        true => Ok(()),
    }
}

/// A REST source's DNS resolver: the same policy on every name its client resolves.
pub(crate) struct PolicyResolver {
    pub(crate) private: PrivateNetworks,
}

/// A name whose addresses the policy refuses, found in a request's error chain.
#[derive(Debug, thiserror::Error)]
#[error("{host} resolves only to loopback, private, link-local or metadata addresses")]
pub(crate) struct RefusedHost {
    pub(crate) host: String,
}

impl PolicyResolver {
    pub(crate) fn shared(private: &PrivateNetworks) -> Arc<Self> {
        Arc::new(PolicyResolver { private: private.clone() })
    }
}

impl Resolve for PolicyResolver {
    // Boxed because reqwest's `Resolving` is a boxed future.
    fn resolve(&self, name: Name) -> Resolving {
        let private = self.private.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let allowed = private.filter(tokio::net::lookup_host((host.as_str(), 0)).await?);
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
        let (wait, none) = (Duration::from_secs(5), PrivateNetworks::default());
        for host in ["127.0.0.1", "localhost", "[::1]", "169.254.169.254", "10.1.2.3"] {
            let refused = resolve(host, 5432, &none, wait).await.unwrap_err();
            assert_eq!(refused.code(), "private_address", "{host}: {refused}");
        }
        let allowed = resolve("127.0.0.1", 5432, &PrivateNetworks::all(), wait).await.unwrap();
        assert_eq!(allowed, vec!["127.0.0.1:5432".parse().unwrap()]);
        let loopback = PrivateNetworks::parse("127.0.0.0/8").unwrap();
        assert_eq!(resolve("127.0.0.1", 5432, &loopback, wait).await.unwrap().len(), 1);
        assert!(check_literal(Some(url::Host::Ipv4([127, 0, 0, 1].into())), &none).is_err());
        assert!(check_literal(Some(url::Host::Ipv4([127, 0, 0, 1].into())), &PrivateNetworks::all()).is_ok());
        assert!(check_literal(Some(url::Host::Domain("example.com")), &none).is_ok());
    }

    #[test]
    fn listed_networks_open_only_themselves() {
        let db = PrivateNetworks::parse(" 10.20.0.0/16, 192.168.7.9 ,fd00:db::/64").unwrap();
        for allowed in ["10.20.3.4", "192.168.7.9", "fd00:db::5", "::ffff:10.20.0.1", "8.8.8.8"] {
            assert!(db.permits(allowed.parse().unwrap()), "{allowed}");
        }
        for refused in ["10.21.0.1", "192.168.7.10", "127.0.0.1", "169.254.169.254", "fd00:dc::1"] {
            assert!(!db.permits(refused.parse().unwrap()), "{refused}");
        }
        assert_eq!(PrivateNetworks::parse("10.20.3.4/16").unwrap(), PrivateNetworks::parse("10.20.0.0/16").unwrap());
        assert_eq!(PrivateNetworks::parse("").unwrap(), PrivateNetworks::default());
        let bad = PrivateNetworks::parse("10.0.0.0/8, db.internal").unwrap_err();
        assert!(bad.contains("\"db.internal\""), "{bad}");
        assert!(PrivateNetworks::default().or_all(true).permits("127.0.0.1".parse().unwrap()));
    }
}
