//! The fleet's data-source client (issue 48): PostgreSQL (tokio-postgres), MySQL and MariaDB
//! (mysql_async) and REST APIs (reqwest), behind one [`DataSources`] per process. The rules it
//! applies (types, connections, limits, mappings, placeholders, the REST path and JSON table) are
//! `fleet_protocol::data_sources`'s; how it behaves is `docs/data-sources.md`.
//!
//! - Every SQL operation runs in a `READ ONLY` transaction, on a session that is read-only by
//!   default too, and is rolled back: a write fails at the database (`read_only`), never by
//!   reading the statement's text. A statement runs under the database's own timeout (PostgreSQL
//!   `statement_timeout`, MariaDB `max_statement_time`, MySQL `max_execution_time`), and the
//!   worker gives up [`GRACE`] after it even if the server does not.
//! - Parameters are bound by the driver, never spliced into the text: as text for PostgreSQL, so
//!   the server parses `"2026-01-01"` as whatever type the placeholder has; `$n` (or `?`) for
//!   MySQL.
//! - Rows are read one at a time up to `max_rows` and `max_bytes` of JSON, then reading stops
//!   (`truncated`): PostgreSQL fetches from a portal in batches, MySQL's connection is closed
//!   rather than drained.
//! - Each source has a bounded pool per process, keyed by its id and a fingerprint of its
//!   connection and pool settings (a changed password gets a new pool). At most
//!   `max_connections` operations run at once per source; others wait up to their statement
//!   timeout, then fail `busy`.
//! - A host is resolved, and its addresses pass the callbacks' private-address policy
//!   (`fleet_protocol::ssrf::permitted`) unless the caller allows private networks; the connection
//!   goes to an address that passed. Connecting is bounded by `connect_timeout_ms`.
//! - No error, log line or `Debug` print holds a password or a header value.

mod address;
mod error;
mod mysql;
mod mysql_values;
mod pool;
mod postgres;
mod postgres_values;
mod rest;
mod rows;

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_protocol::data_sources::{QueryLimits, QueryResult, SourceConnection, SqlConnection, Table};
use serde_json::Value;

pub use address::PrivateNetworks;
pub use error::DataSourceError;

use crate::tls::ClientTls;

/// How long past its statement timeout the worker waits for an answer before it drops the
/// connection itself (the server's own cancel normally comes first).
pub const GRACE: Duration = Duration::from_secs(2);
/// The longest query text taken.
pub const MAX_QUERY_CHARS: usize = 100_000;
/// Sources whose pools one process keeps at once; past it, one is dropped to make room.
const MAX_SOURCES: usize = 1_024;

/// A source as the client reaches it: its connection (secrets open, in memory only), its limits
/// (`max_connections` and `connect_timeout_ms` shape its pool; the rest bound `check` and
/// `extract_schema`) and the private networks it may be on (the operator's choice).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SourceTarget {
    pub connection: SourceConnection,
    pub limits: QueryLimits,
    pub private: PrivateNetworks,
}

impl SourceTarget {
    /// The connection with the default limits, private addresses refused.
    pub fn new(connection: SourceConnection) -> Self {
        SourceTarget { connection, limits: QueryLimits::default(), private: PrivateNetworks::default() }
    }

    pub fn with_limits(mut self, limits: QueryLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Every private network allowed, or none.
    pub fn allowing_private(mut self, allow_private: bool) -> Self {
        self.private = if allow_private { PrivateNetworks::all() } else { PrivateNetworks::default() };
        self
    }

    pub fn on_networks(mut self, private: PrivateNetworks) -> Self {
        self.private = private;
        self
    }

    fn validate(&self) -> Result<(), DataSourceError> {
        self.connection.validate()?;
        self.limits.validate().map_err(|e| DataSourceError::BadTarget(e.to_string()))
    }
}

/// What a SQL driver needs of its source for one operation.
pub(crate) struct SqlCall<'a> {
    pub(crate) sql: &'a SqlConnection,
    /// The source's own limits: its connect timeout, and the statement timeout of `check` and
    /// `extract_schema`.
    pub(crate) limits: &'a QueryLimits,
    pub(crate) private: &'a PrivateNetworks,
    pub(crate) secrets: &'a [String],
}

/// How long an operation may take in all: connecting, the statement, and the grace.
pub(crate) fn deadline(source: &QueryLimits, statement: &QueryLimits) -> Duration {
    Duration::from_millis(source.connect_timeout_ms + statement.statement_timeout_ms) + GRACE
}

/// One source's pool, of its type.
enum Drivers {
    Postgres(pool::Pool<postgres::PgSession>),
    Mysql(pool::Pool<mysql::MySession>),
    Rest(rest::RestClient),
}

struct Entry {
    fingerprint: u64,
    drivers: Drivers,
}

/// The per-process data-source client: a pool per source, reused by every operation, replaced
/// when the source's connection changes. Share one per process (it is `Send + Sync`).
pub struct DataSources {
    entries: Mutex<HashMap<String, Arc<Entry>>>,
    /// Keyed at random per process: a fingerprint reveals nothing of the password it covers.
    hasher: RandomState,
    tls: ClientTls,
}

impl DataSources {
    /// A client whose REST requests trust `tls`'s roots.
    pub fn new(tls: ClientTls) -> Self {
        DataSources { entries: Mutex::new(HashMap::new()), hasher: RandomState::new(), tls }
    }

    /// Reaches the source and runs a trivial query (`SELECT 1`; for REST, a GET of the base URL
    /// answered below 500 and not 401/403).
    pub async fn check(&self, id: &str, target: &SourceTarget) -> Result<(), DataSourceError> {
        let entry = self.entry(id, target)?;
        let secrets = target.connection.secrets();
        match (&entry.drivers, &target.connection) {
            (Drivers::Postgres(pool), SourceConnection::Postgresql(sql)) => {
                postgres::check(pool, &call(sql, target, &secrets)).await
            }
            (Drivers::Mysql(pool), SourceConnection::Mysql(sql)) => {
                mysql::check(pool, &call(sql, target, &secrets)).await
            }
            (Drivers::Rest(client), SourceConnection::RestApi(rest)) => rest::check(client, rest, target).await,
            _ => Err(changed_type()),
        }
    }

    /// The source's tables and their columns: PostgreSQL's user tables and views of every schema
    /// but the system's (or of the connection's `schema`), MySQL's of the connection's database.
    /// A REST API has no schema to read: its list is empty.
    pub async fn extract_schema(&self, id: &str, target: &SourceTarget) -> Result<Vec<Table>, DataSourceError> {
        let entry = self.entry(id, target)?;
        let secrets = target.connection.secrets();
        match (&entry.drivers, &target.connection) {
            (Drivers::Postgres(pool), SourceConnection::Postgresql(sql)) => {
                postgres::schema(pool, &call(sql, target, &secrets)).await
            }
            (Drivers::Mysql(pool), SourceConnection::Mysql(sql)) => {
                mysql::schema(pool, &call(sql, target, &secrets)).await
            }
            (Drivers::Rest(_), SourceConnection::RestApi(_)) => Ok(Vec::new()),
            _ => Err(changed_type()),
        }
    }

    /// Runs one read-only query with positional `parameters` (`$1`, `$2`, …) under `limits`: a
    /// SQL statement, or for a REST API a GET of a path under its base URL.
    pub async fn query(
        &self,
        id: &str,
        target: &SourceTarget,
        sql: &str,
        parameters: &[Value],
        limits: &QueryLimits,
    ) -> Result<QueryResult, DataSourceError> {
        limits.validate().map_err(|e| DataSourceError::BadParameter(e.to_string()))?;
        if sql.trim().is_empty() || sql.chars().count() > MAX_QUERY_CHARS {
            return Err(DataSourceError::BadParameter(format!("the query must be 1-{MAX_QUERY_CHARS} characters")));
        }
        let entry = self.entry(id, target)?;
        let secrets = target.connection.secrets();
        match (&entry.drivers, &target.connection) {
            (Drivers::Postgres(pool), SourceConnection::Postgresql(c)) => {
                postgres::query(pool, &call(c, target, &secrets), sql, parameters, limits).await
            }
            (Drivers::Mysql(pool), SourceConnection::Mysql(c)) => {
                mysql::query(pool, &call(c, target, &secrets), sql, parameters, limits).await
            }
            (Drivers::Rest(client), SourceConnection::RestApi(rest)) => {
                rest::query(client, rest, target, sql, parameters, limits).await
            }
            _ => Err(changed_type()),
        }
    }

    /// Drops the source's pool (its idle connections close): for a source deleted or disabled.
    pub fn forget(&self, id: &str) {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }

    /// The source's pool, made (or remade, when its connection changed) as needed.
    fn entry(&self, id: &str, target: &SourceTarget) -> Result<Arc<Entry>, DataSourceError> {
        target.validate()?;
        let fingerprint = self.hasher.hash_one((
            &target.connection,
            target.limits.max_connections,
            target.limits.connect_timeout_ms,
            &target.private,
        ));
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = entries.get(id).filter(|e| e.fingerprint == fingerprint) {
            return Ok(entry.clone());
        }
        let max = target.limits.max_connections;
        let drivers = match &target.connection {
            SourceConnection::Postgresql(_) => Drivers::Postgres(pool::Pool::new(max)),
            SourceConnection::Mysql(_) => Drivers::Mysql(pool::Pool::new(max)),
            SourceConnection::RestApi(_) => Drivers::Rest(rest::RestClient::new(target, &self.tls)?),
        };
        if entries.len() >= MAX_SOURCES && !entries.contains_key(id) {
            // Any one will do: its in-flight operations keep their pool until they end.
            if let Some(victim) = entries.keys().next().cloned() {
                entries.remove(&victim);
            }
        }
        let entry = Arc::new(Entry { fingerprint, drivers });
        entries.insert(id.to_string(), entry.clone());
        Ok(entry)
    }
}

fn call<'a>(sql: &'a SqlConnection, target: &'a SourceTarget, secrets: &'a [String]) -> SqlCall<'a> {
    SqlCall { sql, limits: &target.limits, private: &target.private, secrets }
}

/// A pool made for another type under the same fingerprint: only a hash collision gets here.
fn changed_type() -> DataSourceError {
    DataSourceError::BadTarget("the source's type changed while in use: try again".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_protocol::data_sources::SourceType;

    fn send_and_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: T) {}

    fn target(password: &str) -> SourceTarget {
        let connection = serde_json::json!({
            "host": "127.0.0.1", "port": 9, "database": "d", "username": "u", "password": password
        });
        SourceTarget::new(SourceConnection::from_parts(SourceType::Postgresql, connection).unwrap())
    }

    /// The worker holds one client in shared state and calls it from spawned tasks.
    #[test]
    fn the_client_and_its_futures_cross_threads() {
        let sources = DataSources::new(ClientTls::default());
        send_and_sync(&sources);
        let target = target("secret-value");
        send(sources.check("ds", &target));
        send(sources.extract_schema("ds", &target));
        send(sources.query("ds", &target, "SELECT 1", &[], &QueryLimits::default()));
        assert!(!format!("{target:?}").contains("secret-value"));
    }

    #[test]
    fn a_changed_connection_gets_a_new_pool_and_the_same_one_reuses_it() {
        let sources = DataSources::new(ClientTls::default());
        let first = sources.entry("ds", &target("one")).unwrap();
        assert!(Arc::ptr_eq(&first, &sources.entry("ds", &target("one")).unwrap()));
        assert!(!Arc::ptr_eq(&first, &sources.entry("ds", &target("two")).unwrap()));
        let bad = target("x").with_limits(QueryLimits { max_rows: 0, ..QueryLimits::default() });
        assert_eq!(sources.entry("ds", &bad).err().map(|e| e.code()), Some("bad_target"));
        sources.forget("ds");
        assert!(sources.entries.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_private_host_is_refused_before_any_connection() {
        let sources = DataSources::new(ClientTls::default());
        let refused = sources.check("ds", &target("pw")).await.unwrap_err();
        assert_eq!(refused.code(), "private_address", "{refused}");
        let closed = sources.check("ds", &target("pw").allowing_private(true)).await.unwrap_err();
        assert_eq!(closed.code(), "unreachable", "{closed}");
    }
}
