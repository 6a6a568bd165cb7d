//! Test support for cross-process tests: `spawn_fleet()` starts real dispatcher and worker
//! processes against the shared RabbitMQ and Redis, each test isolated by its own topology prefix
//! and Redis key prefix; a tool owner's receiver that verifies signatures independently; a TCP
//! proxy that can cut a process off from the broker; clusters of a test's own (a 3-node RabbitMQ,
//! a Redis Cluster with replicas), a steady load whose figures each failover test reports, and the
//! fleet's container image run by podman (`FleetOptions::image`, `container`).

pub mod agent_events;
pub mod binaries;
pub mod cdp;
pub mod console;
pub mod container;
pub mod contract;
pub mod fleet;
pub mod llm;
pub mod load;
pub mod mcp;
pub mod proxy;
pub mod quota;
pub mod rabbit_cluster;
pub mod receiver;
pub mod redis_failover;
pub mod redis_instance;
pub mod rust_mcp;
pub mod schedule;
pub mod seed;
pub mod sockets;
pub mod sse;
pub mod tap;
pub mod tls;
pub mod turn;

use std::future::Future;
use std::time::{Duration, Instant};

pub use fleet::{spawn_fleet, Fleet, FleetOptions};
pub use receiver::{Receiver, Reply};

/// RabbitMQ and Redis as this machine runs them (overridable for other setups).
pub fn amqp_url() -> String {
    std::env::var("FLEET_TEST_AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

pub fn redis_url() -> String {
    std::env::var("FLEET_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// A test's own connection to a Redis (to look at or arrange what the fleet wrote). The client's
/// defaults give up on a reply after 500 ms, which a stalled shared Redis outlasts (a `KEYS` in the
/// parallel phase did, behind other tests' `KEYS` over a keyspace of 450,000 leftover keys): a
/// test's deadlines are its own waits, so this one waits as long as they may.
pub async fn redis_connection(client: &redis::Client) -> redis::aio::MultiplexedConnection {
    let patient = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(Duration::from_secs(60)));
    client.get_multiplexed_async_connection_with_config(&patient).await.expect("a connection to the test's Redis")
}

/// The value of one Prometheus series (`name{labels}` exactly as exposed) in a `/metrics` text; 0
/// when absent.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok())).unwrap_or(0.0)
}

/// Polls `check` every 20 ms until it yields `Some`, or panics after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `cleanup` and exits if the test process is sent SIGTERM (nextest's timeout), so what a
/// guard owns outside the process (detached broker nodes, servers) ends even then; a guard's
/// `Drop` covers the other ways a test ends.
pub fn on_sigterm(cleanup: impl FnOnce() + Send + 'static) {
    tokio::spawn(async move {
        let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else { return };
        term.recv().await;
        tokio::task::spawn_blocking(cleanup).await.ok();
        std::process::exit(143);
    });
}

/// A free TCP port on loopback.
/// Logs in to the console at `api` with `token` as a browser would: fetches the login form (its
/// CSRF token and cookie), then posts it with both. `tls` sends `X-Forwarded-Proto: https`.
pub async fn console_login(http: &reqwest::Client, api: &str, token: &str, tls: bool) -> reqwest::Response {
    let proto = if tls { "https" } else { "http" };
    let form = http.get(format!("{api}/console/login")).header("x-forwarded-proto", proto).send().await.unwrap();
    let cookie = form
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or_default()
        .to_string();
    let page = form.text().await.unwrap();
    let csrf = page.split("name=\"csrf\" value=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or_default();
    http.post(format!("{api}/console/login"))
        .header("x-forwarded-proto", proto)
        .header("cookie", cookie)
        .form(&[("token", token), ("csrf", csrf)])
        .send()
        .await
        .unwrap()
}

/// A port nothing listens on now, for a process the test starts to bind. It is drawn at random
/// from below the kernel's ephemeral range: a port from that range (what binding port 0 gives) can
/// be taken by any outgoing connection before the process binds it, and the suite makes thousands
/// (a dispatcher then failed with "Address already in use", and a test talked to whatever had
/// the port).
///
/// A port is never drawn twice in one test process: two servers a test starts together (a
/// cluster's nodes and their bus ports) would otherwise, rarely, be given the same one.
pub fn free_port() -> u16 {
    static DRAWN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let low = ephemeral_ports_start();
    let floor = 10_000;
    loop {
        let port = if low <= floor + 1_000 {
            std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
        } else {
            let port = floor + (uuid::Uuid::new_v4().as_u128() % u128::from(low - floor)) as u16;
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
                continue;
            }
            port
        };
        if DRAWN.lock().unwrap().insert(port) {
            return port;
        }
    }
}

/// The first port of the kernel's ephemeral range (`ip_local_port_range`; Linux's default 32768).
fn ephemeral_ports_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next().and_then(|low| low.parse().ok()))
        .unwrap_or(32_768)
}

/// HMAC-SHA256 written from RFC 2104 over `sha2` alone, so tests check the fleet's signatures with
/// an implementation independent of the `hmac` crate the fleet uses.
pub fn independent_hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let ipad: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
    let opad: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
    let inner = Sha256::new().chain_update(&ipad).chain_update(message).finalize();
    Sha256::new().chain_update(&opad).chain_update(inner).finalize().into()
}

/// How the audit log names a token: the first 12 hex digits of its SHA-256 digest.
pub fn token_digest_prefix(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))[..12].to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn independent_hmac_matches_rfc_4231() {
        let mac = super::independent_hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(hex::encode(mac), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        let long_key = [0xaau8; 131];
        let mac = super::independent_hmac_sha256(&long_key, b"Test Using Larger Than Block-Size Key - Hash Key First");
        assert_eq!(hex::encode(mac), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    }

    #[test]
    fn a_free_port_is_outside_the_range_outgoing_connections_take() {
        let start = super::ephemeral_ports_start();
        let ports: Vec<u16> = (0..50).map(|_| super::free_port()).collect();
        for port in &ports {
            assert!((10_000..start).contains(port), "{port} not below {start}");
            std::net::TcpListener::bind(("127.0.0.1", *port)).expect("still free");
        }
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert!(distinct.len() > 40, "drawn at random: {ports:?}");
    }
}
