//! PostgreSQL through tokio-postgres: each operation in a `READ ONLY` transaction with a local
//! `statement_timeout`, always rolled back; a query's rows fetched from a portal a batch at a
//! time, so no more than the caps allow is ever read.

use std::time::Duration;

use fleet_protocol::data_sources::{pg_type_name, Column, QueryLimits, QueryResult, Table};
use futures::TryStreamExt;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls, Transaction};

use super::address;
use super::error::{chain, scrub, DataSourceError};
use super::pool::{Lease, Pool};
use super::postgres_values::{renderable, Cell, TextParam};
use super::rows::CappedRows;
use super::SqlCall;

/// Rows asked of the portal at a time: small enough that a batch of wide rows stays small.
const FETCH_ROWS: u64 = 100;

/// A pooled session idle longer than this is asked whether it lives before it is used: one that
/// went back to the pool a moment ago is alive, or its driver saw its end (`is_closed`).
const CHECK_AFTER_IDLE: Duration = Duration::from_secs(1);

/// An open session: the client, the task that drives its connection (ended with it), and the
/// statement timeout it was opened with (its default for every statement).
pub(crate) struct PgSession {
    client: Client,
    driver: JoinHandle<()>,
    statement_timeout_ms: u64,
}

impl Drop for PgSession {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

pub(crate) async fn check(pool: &Pool<PgSession>, call: &SqlCall<'_>) -> Result<(), DataSourceError> {
    let limits = call.limits;
    let mut lease = pool.lease(Duration::from_millis(limits.statement_timeout_ms)).await?;
    let outcome = tokio::time::timeout(super::deadline(call.limits, limits), async {
        let tx = open(&mut lease, call, limits).await?;
        tx.batch_execute("SELECT 1").await.map_err(|e| failure(&e, call, limits))?;
        tx.rollback().await.map_err(|e| failure(&e, call, limits))
    })
    .await;
    finish(lease, outcome, limits)
}

/// The user tables and views of every schema but the system's (or of the connection's `schema`).
pub(crate) async fn schema(pool: &Pool<PgSession>, call: &SqlCall<'_>) -> Result<Vec<Table>, DataSourceError> {
    const COLUMNS: &str = "SELECT c.table_schema::text, c.table_name::text, c.column_name::text, \
         c.data_type::text, c.udt_name::text, c.is_nullable = 'YES' \
         FROM information_schema.columns c JOIN information_schema.tables t \
         ON t.table_schema = c.table_schema AND t.table_name = c.table_name \
         WHERE c.table_schema NOT IN ('pg_catalog', 'information_schema') AND c.table_schema NOT LIKE 'pg\\_%' \
         AND ($1::text IS NULL OR c.table_schema = $1::text) \
         ORDER BY c.table_schema, c.table_name, c.ordinal_position LIMIT 10000";
    let limits = call.limits;
    let mut lease = pool.lease(Duration::from_millis(limits.statement_timeout_ms)).await?;
    let outcome = tokio::time::timeout(super::deadline(call.limits, limits), async {
        let tx = open(&mut lease, call, limits).await?;
        let rows = tx.query(COLUMNS, &[&call.sql.schema]).await.map_err(|e| failure(&e, call, limits))?;
        tx.rollback().await.map_err(|e| failure(&e, call, limits))?;
        Ok(rows)
    })
    .await;
    let mut tables: Vec<Table> = Vec::new();
    for row in finish(lease, outcome, limits)? {
        let (schema, table): (String, String) = (row.get(0), row.get(1));
        let name = if call.sql.schema.as_deref() == Some(schema.as_str()) || schema == "public" {
            table
        } else {
            format!("{schema}.{table}")
        };
        let column = Column { name: row.get(2), r#type: pg_type_name(row.get(3), row.get(4)), nullable: row.get(5) };
        match tables.last_mut() {
            Some(last) if last.name == name => last.columns.push(column),
            _ => tables.push(Table { name, columns: vec![column] }),
        }
    }
    Ok(tables)
}

pub(crate) async fn query(
    pool: &Pool<PgSession>,
    call: &SqlCall<'_>,
    sql: &str,
    parameters: &[Value],
    limits: &QueryLimits,
) -> Result<QueryResult, DataSourceError> {
    let started = Instant::now();
    let params: Vec<TextParam> = parameters.iter().map(TextParam::of).collect();
    let mut lease = pool.lease(Duration::from_millis(limits.statement_timeout_ms)).await?;
    let outcome = tokio::time::timeout(super::deadline(call.limits, limits), async {
        let tx = open(&mut lease, call, limits).await?;
        let read = read(&tx, sql, params, limits).await.map_err(|e| failure(&e, call, limits))??;
        // Dropped, not awaited: its ROLLBACK is sent at once and its answer not waited for; the
        // session's next transaction queues behind it on the same connection.
        drop(tx);
        Ok(read)
    })
    .await;
    let (columns, rows) = finish(lease, outcome, limits)?;
    Ok(rows.into_result(columns, started))
}

/// What a query read: its columns and its rows, or its own failure (a driver error of the fetch is
/// the outer result, so the connection's fate is judged the one way).
type PgRead = Result<(Vec<String>, CappedRows), DataSourceError>;

async fn read(
    tx: &Transaction<'_>,
    sql: &str,
    params: Vec<TextParam>,
    limits: &QueryLimits,
) -> Result<PgRead, tokio_postgres::Error> {
    let statement = tx.prepare(sql).await?;
    if statement.params().len() != params.len() {
        let message = format!("the query takes {} parameter(s), {} given", statement.params().len(), params.len());
        return Ok(Err(DataSourceError::BadParameter(message)));
    }
    let columns: Vec<String> = statement.columns().iter().map(|c| c.name().to_string()).collect();
    if let Some(c) = statement.columns().iter().find(|c| !renderable(c.type_())) {
        let unsupported =
            DataSourceError::UnsupportedValue { column: c.name().into(), type_name: c.type_().name().into() };
        return Ok(Err(unsupported));
    }
    let portal = tx.bind_raw(&statement, params.iter()).await?;
    let mut rows = CappedRows::new(limits);
    loop {
        let batch = rows.room().min(FETCH_ROWS);
        let mut stream = std::pin::pin!(tx.query_portal_raw(&portal, batch as i32).await?);
        let mut fetched = 0;
        while let Some(row) = stream.try_next().await? {
            fetched += 1;
            let mut cells = Vec::with_capacity(columns.len());
            for (at, column) in statement.columns().iter().enumerate() {
                match row.try_get::<_, Cell>(at) {
                    Ok(cell) => cells.push(cell.0),
                    Err(_) => {
                        let name = column.type_().name().to_string();
                        return Ok(Err(DataSourceError::UnsupportedValue {
                            column: column.name().into(),
                            type_name: name,
                        }));
                    }
                }
            }
            if !rows.push(cells) {
                return Ok(Ok((columns, rows)));
            }
        }
        if fetched < batch {
            return Ok(Ok((columns, rows)));
        }
    }
}

/// An operation's end: its session back to the pool after a clean end or a refusal by the server
/// (a transaction that failed was rolled back on its drop); dropped after anything else, or
/// past the deadline (the server cancels the statement at its own timeout).
fn finish<T>(
    lease: Lease<'_, PgSession>,
    outcome: Result<Result<T, DataSourceError>, tokio::time::error::Elapsed>,
    limits: &QueryLimits,
) -> Result<T, DataSourceError> {
    let mut lease = lease;
    match outcome {
        Ok(result) => {
            let keep = result.as_ref().err().is_none_or(server_refusal);
            if keep && lease.conn().is_some_and(|s| !s.client.is_closed()) {
                lease.release();
            }
            result
        }
        Err(_) => Err(DataSourceError::Timeout { timeout_ms: limits.statement_timeout_ms }),
    }
}

/// The lease's session in a new read-only transaction with the statement timeout. A pooled
/// session the server closed while it was idle is replaced once.
async fn open<'l>(
    lease: &'l mut Lease<'_, PgSession>,
    call: &SqlCall<'_>,
    limits: &QueryLimits,
) -> Result<Transaction<'l>, DataSourceError> {
    if lease.conn().is_some_and(|s| s.client.is_closed()) {
        lease.take();
    }
    if lease.reused() && lease.idle_for() > CHECK_AFTER_IDLE {
        let alive = match lease.conn() {
            Some(session) => session.client.check_connection().await.is_ok(),
            None => false,
        };
        if !alive {
            lease.take();
        }
    }
    if lease.conn().is_none() {
        lease.fill(connect(call).await?);
    }
    let session = lease.conn().ok_or_else(|| DataSourceError::ConnectionLost("no session".into()))?;
    begin(session, limits).await.map_err(|e| failure(&e, call, limits))
}

/// A read-only transaction; the statement timeout set in it only when it is not the session's.
/// (A statement that changes the session's own settings is undone with the transaction, which is
/// always rolled back.)
async fn begin<'c>(session: &'c mut PgSession, limits: &QueryLimits) -> Result<Transaction<'c>, tokio_postgres::Error> {
    let own = session.statement_timeout_ms == limits.statement_timeout_ms;
    let tx = session.client.build_transaction().read_only(true).start().await?;
    if !own {
        tx.batch_execute(&format!("SET LOCAL statement_timeout = {}", limits.statement_timeout_ms)).await?;
    }
    Ok(tx)
}

/// A new session: the host resolved under the private-address policy, TCP to an address it
/// allows, then the login, all within the connect timeout. Every transaction of the session is
/// read-only by default too, and its `search_path` is the connection's `schema` when it names one.
async fn connect(call: &SqlCall<'_>) -> Result<PgSession, DataSourceError> {
    let deadline = Duration::from_millis(call.limits.connect_timeout_ms);
    let started = Instant::now();
    let port = u16::try_from(call.sql.port).map_err(|_| DataSourceError::BadTarget("connection.port".into()))?;
    let addrs = address::resolve(&call.sql.host, port, call.private, deadline).await?;
    let stream = address::connect(&addrs, deadline.saturating_sub(started.elapsed())).await?;
    let mut config = tokio_postgres::Config::new();
    config
        .user(&call.sql.username)
        .password(&call.sql.password)
        .dbname(&call.sql.database)
        .application_name("agent-fleet")
        .options(format!(
            "-c default_transaction_read_only=on -c statement_timeout={}",
            call.limits.statement_timeout_ms
        ));
    let login = config.connect_raw(stream, NoTls);
    let (client, connection) = match tokio::time::timeout(deadline.saturating_sub(started.elapsed()), login).await {
        Ok(Ok(opened)) => opened,
        Ok(Err(e)) if e.as_db_error().is_some() => return Err(failure(&e, call, call.limits)),
        Ok(Err(e)) => return Err(DataSourceError::Unreachable(scrub(&chain(&e), call.secrets))),
        Err(_) => return Err(address::no_answer(deadline)),
    };
    let driver = tokio::spawn(async move {
        // The connection's end is seen by the client (`is_closed`): its error has no reader.
        let _ = connection.await;
    });
    let session = PgSession { client, driver, statement_timeout_ms: call.limits.statement_timeout_ms };
    if let Some(schema) = &call.sql.schema {
        let set = format!("SET search_path TO \"{}\"", schema.replace('"', "\"\""));
        session.client.batch_execute(&set).await.map_err(|e| failure(&e, call, call.limits))?;
    }
    Ok(session)
}

/// A driver error as the caller's: the server's refusals by their SQLSTATE, with its message
/// (which never holds a password, and is scrubbed all the same); anything else as a lost link.
fn failure(e: &tokio_postgres::Error, call: &SqlCall<'_>, limits: &QueryLimits) -> DataSourceError {
    let Some(db) = e.as_db_error() else {
        return DataSourceError::ConnectionLost(scrub(&chain(e), call.secrets));
    };
    let message = scrub(db.message(), call.secrets);
    let code = db.code();
    if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        DataSourceError::ReadOnly(message)
    } else if *code == SqlState::QUERY_CANCELED {
        DataSourceError::Timeout { timeout_ms: limits.statement_timeout_ms }
    } else if *code == SqlState::INVALID_PASSWORD || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION {
        DataSourceError::AuthFailed(message)
    } else {
        DataSourceError::Database(message)
    }
}

/// Whether the server refused the statement (the session itself is fine).
fn server_refusal(e: &DataSourceError) -> bool {
    matches!(
        e,
        DataSourceError::ReadOnly(_)
            | DataSourceError::Timeout { .. }
            | DataSourceError::Database(_)
            | DataSourceError::BadParameter(_)
            | DataSourceError::UnsupportedValue { .. }
    )
}
