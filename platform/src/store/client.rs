//! The Redis handle every typed store holds: one lazily connecting, self-reconnecting client per
//! process (cluster or single node), the key names, and the counting of errors.

use std::time::Duration;

use redis::aio::ConnectionManagerConfig;

use fleet_protocol::dead_letters::ListCursor;
use fleet_protocol::keys::Keys;

use crate::metrics::Metrics;
use crate::tls::ClientTls;

use super::connection::{Backend, Conn, Connector};
use super::StoreError;

#[derive(Clone)]
pub struct Redis {
    backend: std::sync::Arc<Backend>,
    /// The URL(s) it was opened with: a Pub/Sub subscriber connects to one of them.
    pub(crate) nodes: std::sync::Arc<Vec<String>>,
    pub(crate) timeout: Duration,
    pub(crate) keys: Keys,
    pub(crate) metrics: Metrics,
}

/// `TCP_NODELAY` for every Redis connection: requests on a multiplexed connection are small writes,
/// and with Nagle's algorithm one written while another was unanswered waited for Redis's
/// acknowledgement.
fn nodelay() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// `url`'s connection settings, with `nodelay()`.
pub(crate) fn sends_at_once(url: &str) -> Result<redis::ConnectionInfo, redis::RedisError> {
    use redis::IntoConnectionInfo;
    Ok(url.into_connection_info()?.set_tcp_settings(nodelay()))
}

impl Redis {
    /// A client for `url` (see `Store::open`), naming keys with `keys` and counting its errors.
    pub(super) fn open(
        url: &str,
        tls: &ClientTls,
        timeout: Duration,
        named: (Keys, Metrics),
    ) -> Result<Self, StoreError> {
        let (keys, metrics) = named;
        let nodes: Vec<&str> = url.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
        let secure = nodes.iter().any(|n| n.starts_with("rediss://"));
        let node_urls: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        let connector = if nodes.len() > 1 {
            let mut builder =
                redis::cluster::ClusterClient::builder(nodes).connection_timeout(timeout).response_timeout(timeout);
            builder = builder.tcp_settings(nodelay());
            if secure {
                builder = builder.certs(tls.redis_certificates());
            }
            Connector::Cluster { client: builder.build()? }
        } else {
            let info = sends_at_once(url)?;
            let client = if secure {
                redis::Client::build_with_tls(info, tls.redis_certificates())?
            } else {
                redis::Client::open(info)?
            };
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_secs(2));
            Connector::Single { client, config }
        };
        Ok(Redis {
            backend: std::sync::Arc::new(Backend::new(connector)),
            nodes: std::sync::Arc::new(node_urls),
            timeout,
            keys,
            metrics,
        })
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub(crate) async fn conn(&self) -> Result<Conn, StoreError> {
        match self.backend.conn().await {
            Ok(conn) => Ok(conn),
            // Having a connection says nothing of its health: only a failure counts here.
            Err(e) => self.count(Err(e)),
        }
    }

    /// Every command's result passes here: errors are counted, and a run of them makes the next
    /// command start over with a new connection.
    pub(crate) fn count<T>(&self, r: Result<T, redis::RedisError>) -> Result<T, StoreError> {
        match r {
            Ok(v) => {
                self.backend.succeeded();
                Ok(v)
            }
            Err(e) => {
                self.metrics.redis_errors.inc();
                self.backend.failed(&e);
                Err(StoreError::Redis(e))
            }
        }
    }

    /// The JSON value at `key` with its stored text (what a conditional write compares against);
    /// one that does not parse is `Corrupt`, naming `what`.
    pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        key: String,
        what: &str,
    ) -> Result<Option<(T, String)>, StoreError> {
        let raw: Result<Option<String>, _> = redis::cmd("GET").arg(key).query_async(&mut self.conn().await?).await;
        self.count(raw)?
            .map(|raw| match serde_json::from_str(&raw) {
                Ok(value) => Ok((value, raw)),
                Err(e) => Err(StoreError::Corrupt(format!("{what}: {e}"))),
            })
            .transpose()
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        let pong: Result<String, _> = redis::cmd("PING").query_async(&mut self.conn().await?).await;
        self.count(pong).map(|_| ())
    }

    /// Redis's `maxmemory-policy`, to warn when it may evict idempotency keys.
    pub async fn maxmemory_policy(&self) -> Result<String, StoreError> {
        let r: Result<Vec<String>, _> =
            redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy").query_async(&mut self.conn().await?).await;
        Ok(self.count(r)?.get(1).cloned().unwrap_or_default())
    }

    /// Up to `limit` entries of the sorted set `set` scored within [`min`, `max`], newest first
    /// (ties by id, descending), after `cursor` if given. Entries of the cursor's millisecond
    /// already returned are skipped, so the read goes on past them.
    pub(crate) async fn zset_newest_first(
        &self,
        set: &str,
        max: &str,
        min: &str,
        cursor: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let mut page: Vec<(String, i64)> = Vec::new();
        let mut offset = 0;
        loop {
            let r: Result<Vec<(String, i64)>, _> = redis::cmd("ZREVRANGEBYSCORE")
                .arg(set)
                .arg(max)
                .arg(min)
                .arg("WITHSCORES")
                .arg("LIMIT")
                .arg(offset)
                .arg(limit)
                .query_async(&mut self.conn().await?)
                .await;
            let batch = self.count(r)?;
            let full = batch.len() == limit;
            offset += batch.len();
            page.extend(batch.into_iter().filter(|(id, at)| cursor.is_none_or(|c| c.precedes(*at, id))));
            if page.len() >= limit || !full {
                page.truncate(limit);
                return Ok(page);
            }
        }
    }
}
