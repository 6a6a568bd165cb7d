//! MySQL and MariaDB through mysql_async: a session read-only by default (`SET SESSION TRANSACTION
//! READ ONLY`, so a statement that commits implicitly, DDL, is refused too), each operation in a
//! `START TRANSACTION READ ONLY` with the server's statement timeout, always rolled back. A query
//! is a prepared statement (one statement, parameters bound); its rows are read one at a time,
//! and a result cut short closes the connection instead of draining the rest.

use std::time::Duration;

use fleet_protocol::data_sources::{question_mark_placeholders, Column, QueryLimits, QueryResult, Table};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder, Params};
use serde_json::Value;
use tokio::time::Instant;

use super::address;
use super::error::{chain, scrub, DataSourceError};
use super::mysql_values::{param, render, renderable, type_name};
use super::pool::{Lease, Pool};
use super::rows::CappedRows;
use super::SqlCall;

/// An open session, and which server it talks to (their statement timeouts differ).
pub(crate) struct MySession {
    conn: Conn,
    mariadb: bool,
}

/// How an operation left its session.
enum Left {
    /// Rolled back: fit for reuse.
    Clean,
    /// A result was cut short: the rest is unread, so the connection must be closed, not reused.
    Unread,
}

pub(crate) async fn check(pool: &Pool<MySession>, call: &SqlCall<'_>) -> Result<(), DataSourceError> {
    let limits = call.limits;
    let mut lease = pool.lease(Duration::from_millis(limits.statement_timeout_ms)).await?;
    let outcome = tokio::time::timeout(super::deadline(call.limits, limits), async {
        let session = open(&mut lease, call, limits).await?;
        session.conn.query_drop("SELECT 1").await.map_err(|e| failure(&e, call, limits))?;
        rollback(session, call, limits).await.map(|left| ((), left))
    })
    .await;
    finish(lease, outcome, limits).await
}

/// The tables and views of the connection's database, with their columns in order.
pub(crate) async fn schema(pool: &Pool<MySession>, call: &SqlCall<'_>) -> Result<Vec<Table>, DataSourceError> {
    const COLUMNS: &str = "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE, IS_NULLABLE = 'YES' \
         FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() \
         ORDER BY TABLE_NAME, ORDINAL_POSITION LIMIT 10000";
    let limits = call.limits;
    let mut lease = pool.lease(Duration::from_millis(limits.statement_timeout_ms)).await?;
    let outcome = tokio::time::timeout(super::deadline(call.limits, limits), async {
        let session = open(&mut lease, call, limits).await?;
        let rows: Vec<(String, String, String, i64)> =
            session.conn.query(COLUMNS).await.map_err(|e| failure(&e, call, limits))?;
        rollback(session, call, limits).await.map(|left| (rows, left))
    })
    .await;
    let mut tables: Vec<Table> = Vec::new();
    for (table, name, data_type, nullable) in finish(lease, outcome, limits).await? {
        let column = Column { name, r#type: data_type, nullable: nullable != 0 };
        match tables.last_mut() {
            Some(last) if last.name == table => last.columns.push(column),
            _ => tables.push(Table { name: table, columns: vec![column] }),
        }
    }
    Ok(tables)
}

pub(crate) async fn query(
    pool: &Pool<MySession>,
    call: &SqlCall<'_>,
    sql: &str,
    parameters: &[Value],
    limits: &QueryLimits,
) -> Result<QueryResult, DataSourceError> {
    let started = Instant::now();
    let placeholders = question_mark_placeholders(sql).map_err(|e| DataSourceError::BadParameter(e.to_string()))?;
    if placeholders.expects != parameters.len() {
        let message = format!("the query takes {} parameter(s), {} given", placeholders.expects, parameters.len());
        return Err(DataSourceError::BadParameter(message));
    }
    let values: Vec<mysql_async::Value> = placeholders.order.iter().map(|&i| param(&parameters[i])).collect();
    let mut lease = pool.lease(Duration::from_millis(limits.statement_timeout_ms)).await?;
    let outcome = tokio::time::timeout(super::deadline(call.limits, limits), async {
        let session = open(&mut lease, call, limits).await?;
        let (columns, rows) = read(&mut session.conn, &placeholders.sql, values, limits)
            .await
            .map_err(|e| failure(&e, call, limits))??;
        if rows.truncated() {
            return Ok(((columns, rows), Left::Unread));
        }
        rollback(session, call, limits).await.map(|left| ((columns, rows), left))
    })
    .await;
    let (columns, rows) = finish(lease, outcome, limits).await?;
    Ok(rows.into_result(columns, started))
}

/// What a query read, or its own refusal (a driver error is the outer result).
type MyRead = Result<(Vec<String>, CappedRows), DataSourceError>;

async fn read(
    conn: &mut Conn,
    sql: &str,
    values: Vec<mysql_async::Value>,
    limits: &QueryLimits,
) -> Result<MyRead, mysql_async::Error> {
    let statement = conn.prep(sql).await?;
    if usize::from(statement.num_params()) != values.len() {
        let message = format!("the query takes {} parameter(s), {} given", statement.num_params(), values.len());
        return Ok(Err(DataSourceError::BadParameter(message)));
    }
    let params = if values.is_empty() { Params::Empty } else { Params::Positional(values) };
    let mut result = conn.exec_iter(&statement, params).await?;
    let described = result.columns().unwrap_or_else(|| Vec::new().into());
    if let Some(column) = described.iter().find(|c| !renderable(c)) {
        // Its rows stay unread: the session is closed, not drained (see `finish`).
        return Ok(Err(DataSourceError::UnsupportedValue {
            column: column.name_str().into(),
            type_name: type_name(column),
        }));
    }
    let columns: Vec<String> = described.iter().map(|c| c.name_str().into_owned()).collect();
    let mut rows = CappedRows::new(limits);
    while let Some(row) = result.next().await? {
        let values = row.unwrap_raw().into_iter().map(|v| v.unwrap_or(mysql_async::Value::NULL));
        let cells: Vec<Value> = values.zip(described.iter()).map(|(v, c)| render(c, v)).collect();
        if !rows.push(cells) {
            break;
        }
    }
    Ok(Ok((columns, rows)))
}

/// The lease's session in a new read-only transaction under the statement timeout (and a select
/// limit one past `max_rows`, so the server stops sending early where the query has no LIMIT).
async fn open<'l>(
    lease: &'l mut Lease<'_, MySession>,
    call: &SqlCall<'_>,
    limits: &QueryLimits,
) -> Result<&'l mut MySession, DataSourceError> {
    let mut retried = false;
    loop {
        if lease.conn().is_none() {
            lease.fill(connect(call).await?);
        }
        let reused = lease.reused();
        let session = lease.conn().ok_or_else(|| DataSourceError::ConnectionLost("no session".into()))?;
        match begin(session, call, limits).await {
            Ok(()) => break,
            // A pooled connection the server closed while it was idle: once more, on a new one.
            Err(DataSourceError::ConnectionLost(_)) if reused && !retried => {
                lease.take();
                retried = true;
            }
            Err(e) => return Err(e),
        }
    }
    lease.conn().ok_or_else(|| DataSourceError::ConnectionLost("no session".into()))
}

async fn begin(session: &mut MySession, call: &SqlCall<'_>, limits: &QueryLimits) -> Result<(), DataSourceError> {
    let ms = limits.statement_timeout_ms;
    let timeout = match session.mariadb {
        true => format!("max_statement_time = {}.{:03}", ms / 1000, ms % 1000),
        false => format!("max_execution_time = {ms}"),
    };
    let setup = [
        format!("SET SESSION {timeout}, SESSION sql_select_limit = {}", limits.max_rows + 1),
        "SET SESSION TRANSACTION READ ONLY".to_string(),
        "START TRANSACTION READ ONLY".to_string(),
    ];
    for statement in setup {
        session.conn.query_drop(statement).await.map_err(|e| failure(&e, call, limits))?;
    }
    Ok(())
}

async fn rollback(session: &mut MySession, call: &SqlCall<'_>, limits: &QueryLimits) -> Result<Left, DataSourceError> {
    session.conn.query_drop("ROLLBACK").await.map_err(|e| failure(&e, call, limits))?;
    Ok(Left::Clean)
}

/// An operation's end: a clean session back to the pool, and one the server refused once it is
/// rolled back; any other (a column with no rendering included, its rows unread) closed without
/// reading what is left of its answer.
async fn finish<T>(
    mut lease: Lease<'_, MySession>,
    outcome: Result<Result<(T, Left), DataSourceError>, tokio::time::error::Elapsed>,
    limits: &QueryLimits,
) -> Result<T, DataSourceError> {
    let (result, keep) = match outcome {
        Ok(Ok((value, Left::Clean))) => (Ok(value), true),
        Ok(Ok((value, Left::Unread))) => (Ok(value), false),
        Ok(Err(e)) => {
            let refused = matches!(
                e,
                DataSourceError::ReadOnly(_)
                    | DataSourceError::Database(_)
                    | DataSourceError::BadParameter(_)
                    | DataSourceError::Timeout { .. }
            );
            let rolled_back = match lease.conn() {
                Some(session) if refused => {
                    let rollback = session.conn.query_drop("ROLLBACK");
                    matches!(tokio::time::timeout(super::GRACE, rollback).await, Ok(Ok(())))
                }
                _ => false,
            };
            (Err(e), rolled_back)
        }
        Err(_) => (Err(DataSourceError::Timeout { timeout_ms: limits.statement_timeout_ms }), false),
    };
    if keep {
        lease.release();
    } else if let Some(session) = lease.take() {
        abandon(session.conn).await;
    }
    result
}

/// Closes a connection without reading what the server still sends. mysql_async drains a pending
/// answer before it says goodbye, so its goodbye gets no time to wait: it marks the connection
/// closed before writing, and the socket is dropped with it.
async fn abandon(conn: Conn) {
    let _ = tokio::time::timeout(Duration::ZERO, conn.disconnect()).await;
}

/// A new session: the host resolved under the private-address policy, then the login to an
/// address that passed, within the connect timeout; then which server it is, and every
/// transaction of the session made read-only by default.
async fn connect(call: &SqlCall<'_>) -> Result<MySession, DataSourceError> {
    let deadline = Duration::from_millis(call.limits.connect_timeout_ms);
    let started = Instant::now();
    let port = u16::try_from(call.sql.port).map_err(|_| DataSourceError::BadTarget("connection.port".into()))?;
    let addrs = address::resolve(&call.sql.host, port, call.private, deadline).await?;
    let addr = addrs.first().ok_or_else(|| DataSourceError::Unreachable("no address".into()))?;
    let opts = OptsBuilder::default()
        .ip_or_hostname(addr.ip().to_string())
        .tcp_port(addr.port())
        .user(Some(&call.sql.username))
        .pass(Some(&call.sql.password))
        .db_name(Some(&call.sql.database))
        // Never move to a Unix socket: the policy checked the TCP address.
        .prefer_socket(false)
        .stmt_cache_size(16)
        .init(vec!["SET SESSION TRANSACTION READ ONLY"]);
    let mut conn = match tokio::time::timeout(deadline.saturating_sub(started.elapsed()), Conn::new(opts)).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e @ mysql_async::Error::Server(_))) => return Err(failure(&e, call, call.limits)),
        Ok(Err(e)) => return Err(DataSourceError::Unreachable(scrub(&chain(&e), call.secrets))),
        Err(_) => return Err(address::no_answer(deadline)),
    };
    let version: Option<String> =
        conn.query_first("SELECT VERSION()").await.map_err(|e| failure(&e, call, call.limits))?;
    Ok(MySession { conn, mariadb: version.is_some_and(|v| v.contains("MariaDB")) })
}

/// MySQL's and MariaDB's error numbers the caller acts on.
const ER_DBACCESS_DENIED: u16 = 1044;
const ER_ACCESS_DENIED: u16 = 1045;
const ER_ACCESS_DENIED_NO_PASSWORD: u16 = 1698;
const ER_READ_ONLY_TRANSACTION: u16 = 1792;
const ER_STATEMENT_TIMEOUT: u16 = 1969;
const ER_QUERY_TIMEOUT: u16 = 3024;

/// A driver error as the caller's: the server's refusals by number, with its message (scrubbed of
/// the password all the same); anything else as a lost link.
fn failure(e: &mysql_async::Error, call: &SqlCall<'_>, limits: &QueryLimits) -> DataSourceError {
    match e {
        mysql_async::Error::Server(server) => {
            let message = scrub(&server.message, call.secrets);
            match server.code {
                ER_READ_ONLY_TRANSACTION => DataSourceError::ReadOnly(message),
                ER_STATEMENT_TIMEOUT | ER_QUERY_TIMEOUT => {
                    DataSourceError::Timeout { timeout_ms: limits.statement_timeout_ms }
                }
                ER_DBACCESS_DENIED | ER_ACCESS_DENIED | ER_ACCESS_DENIED_NO_PASSWORD => {
                    DataSourceError::AuthFailed(message)
                }
                _ => DataSourceError::Database(message),
            }
        }
        mysql_async::Error::Driver(driver) => DataSourceError::Database(scrub(&driver.to_string(), call.secrets)),
        other => DataSourceError::ConnectionLost(scrub(&chain(other), call.secrets)),
    }
}
