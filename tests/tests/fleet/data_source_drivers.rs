//! The data-source drivers (`fleet_platform::data_sources`) against the real PostgreSQL and
//! MariaDB of `scripts/ensure-services.sh`, and a REST API served here: the seed's schema read
//! back, the seed's query with a text parameter against a timestamp, every kind of write refused
//! by the database with nothing changed, parameters that never become SQL, statement timeouts,
//! row and byte caps, a wrong password, an unreachable or silent server, private addresses.
//!
//! Each test makes a schema (PostgreSQL) or a database (MariaDB) `t_<random>` of its own with the
//! seed's `customers` and `orders`, and drops it at the end, so the tests run in parallel.

use std::net::TcpListener as StdListener;
use std::time::{Duration, Instant};

use fleet_platform::data_sources::{DataSourceError, DataSources, PrivateNetworks, SourceTarget};
use fleet_platform::tls::ClientTls;
use fleet_tests::seed::{MARIA_SEED_TABLES, PG_SEED_TABLES};
use fleet_protocol::data_sources::{Column, QueryLimits, QueryResult, SourceConnection, SourceType, Table};
use mysql_async::prelude::Queryable;
use serde_json::{json, Value};

pub(crate) const USER: &str = "fleet_test";
pub(crate) const PASSWORD: &str = "fleet_test_pw";
pub(crate) const DATABASE: &str = "fleet_ds";

fn unique() -> String {
    format!("t_{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

fn sources() -> DataSources {
    DataSources::new(ClientTls::default())
}

fn sql_target(source_type: SourceType, port: u16, database: &str, schema: Option<&str>, password: &str) -> SourceTarget {
    let mut connection = json!({
        "host": "127.0.0.1", "port": port, "database": database, "username": USER, "password": password
    });
    if let Some(schema) = schema {
        connection["schema"] = json!(schema);
    }
    SourceTarget::new(SourceConnection::from_parts(source_type, connection).unwrap()).allowing_private(true)
}

fn limits(statement_timeout_ms: u64, max_rows: u64, max_bytes: u64) -> QueryLimits {
    QueryLimits { statement_timeout_ms, max_rows, max_bytes, ..QueryLimits::default() }
}

fn column(name: &str, r#type: &str, nullable: bool) -> Column {
    Column { name: name.into(), r#type: r#type.into(), nullable }
}

/// The seed's `customers` and `orders` as a schema extraction reads them, with the server's names
/// for a timestamp and a decimal.
fn seed_tables(time: &str, money: &str) -> Vec<Table> {
    vec![
        Table {
            name: "customers".into(),
            columns: vec![
                column("id", "uuid", false),
                column("email", "varchar", false),
                column("name", "varchar", true),
                column("created_at", time, false),
            ],
        },
        Table {
            name: "orders".into(),
            columns: vec![
                column("id", "uuid", false),
                column("customer_id", "uuid", false),
                column("total_amount", money, false),
                column("created_at", time, false),
            ],
        },
    ]
}

/// The seed's customers as the query answers them: id, email, name, created_at.
fn seed_customers_after_2026() -> Vec<Vec<Value>> {
    vec![
        vec![json!("11111111-1111-1111-1111-111111111111"), json!("john@example.com"), json!("John Doe"), json!("2026-01-15T10:00:00Z")],
        vec![json!("22222222-2222-2222-2222-222222222222"), json!("jane@example.com"), json!("Jane Smith"), json!("2026-01-16T11:00:00Z")],
    ]
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A server that accepts connections and never says a word.
async fn silent_server() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (port, task)
}

fn assert_code(result: Result<impl std::fmt::Debug, DataSourceError>, code: &str) -> DataSourceError {
    let e = result.expect_err("the operation must fail");
    assert_eq!(e.code(), code, "{e}");
    e
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL

/// A schema of the test's own in `fleet_ds`, with the seed's tables, a sequence and a function
/// that writes; dropped at the end (even when the test fails).
pub(crate) struct PgSchema {
    pub(crate) name: String,
    admin: tokio_postgres::Client,
    _driver: tokio::task::JoinHandle<()>,
}

async fn pg_admin() -> (tokio_postgres::Client, tokio::task::JoinHandle<()>) {
    let config = format!("host=127.0.0.1 port=5432 user={USER} password={PASSWORD} dbname={DATABASE}");
    let (client, connection) = tokio_postgres::connect(&config, tokio_postgres::NoTls)
        .await
        .expect("PostgreSQL on 127.0.0.1:5432 with the test user (scripts/ensure-services.sh)");
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    (client, driver)
}

impl PgSchema {
    pub(crate) async fn new() -> PgSchema {
        let (admin, driver) = pg_admin().await;
        let name = unique();
        let setup = format!(
            "CREATE SCHEMA {name};
             SET search_path TO {name};
             {PG_SEED_TABLES}
             CREATE SEQUENCE ticket;
             CREATE FUNCTION bump() RETURNS integer LANGUAGE sql VOLATILE AS
               $$ INSERT INTO {name}.orders VALUES (gen_random_uuid(), '11111111-1111-1111-1111-111111111111', 1, now()) RETURNING 1 $$;"
        );
        admin.batch_execute(&setup).await.expect("the test schema is made");
        PgSchema { name, admin, _driver: driver }
    }

    fn target(&self) -> SourceTarget {
        sql_target(SourceType::Postgresql, 5432, DATABASE, Some(&self.name), PASSWORD)
    }

    async fn count(&self, table: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {}.{table}", self.name);
        self.admin.query_one(&sql, &[]).await.unwrap().get(0)
    }

    pub(crate) async fn state(&self) -> (i64, i64, i64) {
        let ticket: i64 =
            self.admin.query_one(&format!("SELECT last_value FROM {}.ticket", self.name), &[]).await.unwrap().get(0);
        (self.count("customers").await, self.count("orders").await, ticket)
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let name = self.name.clone();
        // A runtime of its own: the test's may be gone (a panic), and Drop cannot await.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let (admin, _driver) = pg_admin().await;
                let _ = admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE")).await;
            });
        })
        .join();
    }
}

#[tokio::test]
async fn postgres_schema_is_extracted_as_the_seed_shows_it() {
    let db = PgSchema::new().await;
    let tables = sources().extract_schema("ds_pg", &db.target()).await.unwrap();
    let expected = seed_tables("timestamp", "numeric");
    assert_eq!(tables, expected);
    // Without a schema named, every schema but the system's is read, each table qualified.
    let everywhere = sql_target(SourceType::Postgresql, 5432, DATABASE, None, PASSWORD);
    let all = sources().extract_schema("ds_pg_all", &everywhere).await.unwrap();
    let orders = all.iter().find(|t| t.name == format!("{}.orders", db.name)).expect("qualified by its schema");
    assert_eq!(orders.columns, expected[1].columns);
    assert!(all.iter().all(|t| !t.name.starts_with("pg_catalog.") && !t.name.starts_with("information_schema.")));
}

#[tokio::test]
async fn postgres_runs_the_seeds_query_with_a_text_parameter_against_a_timestamp() {
    let db = PgSchema::new().await;
    let sources = sources();
    let sql = "SELECT * FROM customers WHERE created_at > $1 ORDER BY created_at LIMIT 10";
    let result = sources.query("ds_pg", &db.target(), sql, &[json!("2026-01-01")], &QueryLimits::default()).await.unwrap();
    assert_eq!(result.columns, vec!["id", "email", "name", "created_at"]);
    assert_eq!(result.rows, seed_customers_after_2026());
    assert_eq!((result.row_count, result.truncated), (2, false));
    // The seed's other shape, a total over a numeric column.
    let sql = "SELECT SUM(total_amount) AS total, COUNT(*) FROM orders WHERE created_at >= $1";
    let total = sources.query("ds_pg", &db.target(), sql, &[json!("2026-01-14")], &QueryLimits::default()).await.unwrap();
    assert_eq!(total.rows, vec![vec![json!(1220.49), json!(2)]]);
    let missing = sources.query("ds_pg", &db.target(), "SELECT $1::int", &[], &QueryLimits::default()).await;
    assert_code(missing, "bad_parameter");
    let unknown = sources.query("ds_pg", &db.target(), "SELECT * FROM invoices", &[], &QueryLimits::default()).await;
    let unknown = assert_code(unknown, "database_error");
    assert!(unknown.to_string().contains("\"invoices\" does not exist"), "{unknown}");
}

#[tokio::test]
async fn postgres_values_render_as_json() {
    let db = PgSchema::new().await;
    let sql = "SELECT 42::int2, 7::int4, 9007199254740993::int8, 1.5::float4, 2.25::float8, 19.90::numeric(6,2), \
               12345678901234567890.5::numeric, true, 'txt'::text, 'x'::char(3), '{\"a\": [1, null]}'::jsonb, \
               '\\x00ff'::bytea, '2026-01-15'::date, '10:00:00.5'::time, '2026-01-15 10:00:00+02'::timestamptz, \
               'infinity'::timestamp, '1 day 02:00:00'::interval, ARRAY[1, NULL, 3], '{a,b}'::text[], NULL::int";
    let result = sources().query("ds_pg", &db.target(), sql, &[], &QueryLimits::default()).await.unwrap();
    let expected = vec![
        json!(42),
        json!(7),
        json!(9007199254740993i64),
        json!(1.5),
        json!(2.25),
        json!(19.9),
        json!("12345678901234567890.5"),
        json!(true),
        json!("txt"),
        json!("x  "),
        json!({"a": [1, null]}),
        json!("AP8="),
        json!("2026-01-15"),
        json!("10:00:00.500000"),
        json!("2026-01-15T08:00:00Z"),
        json!("infinity"),
        json!("P1DT2H"),
        json!([1, null, 3]),
        json!(["a", "b"]),
        json!(null),
    ];
    assert_eq!(result.rows, vec![expected]);
    let point = sources().query("ds_pg", &db.target(), "SELECT point(1, 2) AS spot", &[], &QueryLimits::default()).await;
    let point = assert_code(point, "unsupported_value");
    assert!(point.to_string().contains("`spot`") && point.to_string().contains("point"), "{point}");
}

#[tokio::test]
async fn postgres_refuses_every_write_at_the_database_and_changes_nothing() {
    let db = PgSchema::new().await;
    let sources = sources();
    let before = db.state().await;
    let writes = [
        "INSERT INTO customers VALUES (gen_random_uuid(), 'x@example.com', 'X', now())",
        "UPDATE customers SET name = 'changed'",
        "DELETE FROM orders",
        "DROP TABLE orders",
        "CREATE TABLE extra (id int)",
        "TRUNCATE orders",
        "WITH moved AS (DELETE FROM orders RETURNING id) SELECT * FROM moved",
        "SELECT nextval('ticket')",
        "SELECT bump()",
        "SELECT * FROM customers FOR UPDATE",
    ];
    for write in writes {
        let refused = sources.query("ds_pg", &db.target(), write, &[], &QueryLimits::default()).await;
        let refused = assert_code(refused, "read_only");
        assert!(refused.to_string().contains("read-only transaction"), "{write}: {refused}");
    }
    let insert = sources.query("ds_pg", &db.target(), writes[0], &[], &QueryLimits::default()).await.unwrap_err();
    assert_eq!(insert.to_string(), "the data source is read-only: cannot execute INSERT in a read-only transaction");
    // A setting changed by a query lasts no longer than its transaction.
    let set = "SELECT set_config('search_path', 'pg_catalog', false)";
    sources.query("ds_pg", &db.target(), set, &[], &QueryLimits::default()).await.unwrap();
    let count = sources.query("ds_pg", &db.target(), "SELECT count(*) FROM customers", &[], &QueryLimits::default()).await;
    assert_eq!(count.unwrap().rows, vec![vec![json!(3)]]);
    assert_eq!(db.state().await, before, "nothing was written");
}

#[tokio::test]
async fn postgres_parameters_never_become_sql() {
    let db = PgSchema::new().await;
    let sources = sources();
    let sql = "SELECT * FROM customers WHERE email = $1";
    for injection in ["' OR 1=1 --", "x'; DROP TABLE customers; --", "john@example.com' OR 'a'='a"] {
        let result = sources.query("ds_pg", &db.target(), sql, &[json!(injection)], &QueryLimits::default()).await;
        assert_eq!(result.unwrap().rows, Vec::<Vec<Value>>::new(), "{injection}");
    }
    let exact = sources.query("ds_pg", &db.target(), sql, &[json!("john@example.com")], &QueryLimits::default()).await;
    assert_eq!(exact.unwrap().row_count, 1);
    assert_eq!(db.count("customers").await, 3);
}

#[tokio::test]
async fn postgres_statement_timeout_cancels_a_long_query_promptly() {
    let db = PgSchema::new().await;
    let sources = sources();
    let started = Instant::now();
    let late = sources.query("ds_pg", &db.target(), "SELECT pg_sleep(10)", &[], &limits(500, 1000, 1 << 20)).await;
    assert_code(late, "timeout");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    // The pooled session is fine afterwards.
    let next = sources.query("ds_pg", &db.target(), "SELECT 1 AS one", &[], &QueryLimits::default()).await.unwrap();
    assert_eq!(next.rows, vec![vec![json!(1)]]);
}

#[tokio::test]
async fn postgres_caps_rows_and_bytes_and_says_truncated() {
    let db = PgSchema::new().await;
    let sources = sources();
    let many = "SELECT g FROM generate_series(1, 1000000) g";
    let capped = sources.query("ds_pg", &db.target(), many, &[], &limits(5000, 10, 1 << 20)).await.unwrap();
    assert_eq!((capped.row_count, capped.truncated), (10, true));
    assert_eq!(capped.rows.last(), Some(&vec![json!(10)]));
    let exact = "SELECT g FROM generate_series(1, 10) g";
    let whole = sources.query("ds_pg", &db.target(), exact, &[], &limits(5000, 10, 1 << 20)).await.unwrap();
    assert_eq!((whole.row_count, whole.truncated), (10, false));
    let wide = "SELECT repeat('x', 1000) FROM generate_series(1, 100000)";
    let bytes = sources.query("ds_pg", &db.target(), wide, &[], &limits(5000, 100_000, 10 * 1024)).await.unwrap();
    assert!(bytes.truncated && bytes.row_count == 10, "{} rows", bytes.row_count);
    assert!(serde_json::to_vec(&bytes.rows).unwrap().len() <= 10 * 1024 + 64);
}

#[tokio::test]
async fn postgres_wrong_password_is_refused_without_the_password() {
    let db = PgSchema::new().await;
    let sources = sources();
    assert!(sources.check("ds_pg", &db.target()).await.is_ok());
    // The same source with a changed password gets a new pool, not the open sessions.
    let wrong = sql_target(SourceType::Postgresql, 5432, DATABASE, Some(&db.name), "wrong-pass-7f3a9c");
    let refused = assert_code(sources.check("ds_pg", &wrong).await, "auth_failed");
    let shown = format!("{refused} {refused:?} {wrong:?}");
    assert!(refused.to_string().contains("password authentication failed"), "{refused}");
    assert!(!shown.contains("wrong-pass-7f3a9c") && !shown.contains(PASSWORD), "{shown}");
    let missing = sql_target(SourceType::Postgresql, 5432, "no_such_db", None, PASSWORD);
    let missing = assert_code(sources.check("ds_missing", &missing).await, "database_error");
    assert!(missing.to_string().contains("no_such_db"), "{missing}");
}

#[tokio::test]
async fn sql_servers_that_do_not_answer_are_unreachable_within_the_connect_timeout() {
    let sources = sources();
    let quick = QueryLimits { connect_timeout_ms: 700, ..QueryLimits::default() };
    for source_type in [SourceType::Postgresql, SourceType::Mysql] {
        let closed = sql_target(source_type, closed_port(), DATABASE, None, PASSWORD).with_limits(quick);
        let started = Instant::now();
        assert_code(sources.check("ds_closed", &closed).await, "unreachable");
        assert!(started.elapsed() < Duration::from_secs(2), "{source_type:?}: {:?}", started.elapsed());

        let (port, _server) = silent_server().await;
        let silent = sql_target(source_type, port, DATABASE, None, PASSWORD).with_limits(quick);
        let started = Instant::now();
        let result = sources.query("ds_silent", &silent, "SELECT 1", &[], &QueryLimits::default()).await;
        let e = assert_code(result, "unreachable");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(650) && waited < Duration::from_secs(3), "{source_type:?}: {waited:?} {e}");
    }
}

#[tokio::test]
async fn private_addresses_are_refused_unless_the_operator_allows_them() {
    let sources = sources();
    for (source_type, port) in [(SourceType::Postgresql, 5432), (SourceType::Mysql, 3306)] {
        for host in ["127.0.0.1", "localhost", "::1"] {
            let mut target = sql_target(source_type, port, DATABASE, None, PASSWORD).allowing_private(false);
            if let SourceConnection::Postgresql(sql) | SourceConnection::Mysql(sql) = &mut target.connection {
                sql.host = host.into();
            }
            let refused = assert_code(sources.check("ds_private", &target).await, "private_address");
            assert!(refused.to_string().contains(host), "{refused}");
        }
    }
    let allowed = sql_target(SourceType::Postgresql, 5432, DATABASE, None, PASSWORD);
    sources.check("ds_private", &allowed).await.unwrap();
    // A listed network opens itself only.
    let listed = |networks: &str| allowed.clone().on_networks(PrivateNetworks::parse(networks).unwrap());
    sources.check("ds_listed", &listed("127.0.0.0/8")).await.unwrap();
    assert_code(sources.check("ds_unlisted", &listed("10.0.0.0/8, ::1")).await, "private_address");
}

#[tokio::test]
async fn postgres_queries_share_a_bounded_pool_per_source() {
    let db = PgSchema::new().await;
    let sources = sources();
    let target = db.target().with_limits(QueryLimits { max_connections: 2, ..QueryLimits::default() });
    let started = Instant::now();
    let sleeps = (0..4).map(|_| sources.query("ds_pool", &target, "SELECT pg_sleep(0.4)", &[], &target.limits));
    for result in futures::future::join_all(sleeps).await {
        result.unwrap();
    }
    assert!(started.elapsed() >= Duration::from_millis(800), "two at a time: {:?}", started.elapsed());
    let mut backends = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let pid = sources.query("ds_pool", &target, "SELECT pg_backend_pid()", &[], &target.limits).await.unwrap();
        backends.insert(pid.rows[0][0].to_string());
    }
    assert!(backends.len() <= 2, "sessions are reused: {backends:?}");
    // A caller that cannot get a slot within its statement timeout is told the source is busy.
    let slow = sources.query("ds_pool", &target, "SELECT pg_sleep(1)", &[], &target.limits);
    let slow2 = sources.query("ds_pool", &target, "SELECT pg_sleep(1)", &[], &target.limits);
    let hurried = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        sources.query("ds_pool", &target, "SELECT 1", &[], &limits(200, 10, 1 << 20)).await
    };
    let (a, b, c) = tokio::join!(slow, slow2, hurried);
    assert!(a.is_ok() && b.is_ok());
    assert_code(c, "busy");
}

// ---------------------------------------------------------------------------------------------
// MariaDB

/// A database `t_…` of the test's own with the seed's tables and a function that writes.
pub(crate) struct MariaDb {
    pub(crate) name: String,
}

fn maria_opts(database: Option<&str>) -> mysql_async::OptsBuilder {
    mysql_async::OptsBuilder::default()
        .ip_or_hostname("127.0.0.1")
        .tcp_port(3306)
        .user(Some(USER))
        .pass(Some(PASSWORD))
        .db_name(database)
        .prefer_socket(false)
}

pub(crate) async fn maria_admin(database: Option<&str>) -> mysql_async::Conn {
    mysql_async::Conn::new(maria_opts(database))
        .await
        .expect("MariaDB on 127.0.0.1:3306 with the test user (scripts/ensure-services.sh)")
}

impl MariaDb {
    pub(crate) async fn new() -> MariaDb {
        let name = unique();
        let mut admin = maria_admin(None).await;
        admin.query_drop(format!("CREATE DATABASE {name}")).await.unwrap();
        admin.query_drop(format!("USE {name}")).await.unwrap();
        let bump = "CREATE FUNCTION bump() RETURNS INT MODIFIES SQL DATA BEGIN \
             INSERT INTO orders VALUES (UUID(), '11111111-1111-1111-1111-111111111111', 1, NOW()); RETURN 1; END";
        for statement in MARIA_SEED_TABLES.into_iter().chain([bump]) {
            admin.query_drop(statement).await.expect("the test database is made");
        }
        let _ = admin.disconnect().await;
        MariaDb { name }
    }

    fn target(&self) -> SourceTarget {
        sql_target(SourceType::Mysql, 3306, &self.name, None, PASSWORD)
    }

    pub(crate) async fn counts(&self) -> (i64, i64, Vec<String>) {
        let mut admin = maria_admin(Some(&self.name)).await;
        let customers: Option<i64> = admin.query_first("SELECT COUNT(*) FROM customers").await.unwrap();
        let orders: Option<i64> = admin.query_first("SELECT COUNT(*) FROM orders").await.unwrap();
        let tables: Vec<String> = admin.query("SHOW TABLES").await.unwrap();
        let _ = admin.disconnect().await;
        (customers.unwrap_or(-1), orders.unwrap_or(-1), tables)
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let mut admin = maria_admin(None).await;
                let _ = admin.query_drop(format!("DROP DATABASE IF EXISTS {name}")).await;
                let _ = admin.disconnect().await;
            });
        })
        .join();
    }
}

#[tokio::test]
async fn mariadb_schema_is_extracted_from_the_connections_database() {
    let db = MariaDb::new().await;
    let tables = sources().extract_schema("ds_my", &db.target()).await.unwrap();
    assert_eq!(tables, seed_tables("datetime", "decimal"));
}

#[tokio::test]
async fn mariadb_runs_the_seeds_query_with_a_dollar_parameter() {
    let db = MariaDb::new().await;
    let sources = sources();
    for sql in [
        "SELECT * FROM customers WHERE created_at > $1 ORDER BY created_at LIMIT 10",
        "SELECT * FROM customers WHERE created_at > ? ORDER BY created_at LIMIT 10",
    ] {
        let result = sources.query("ds_my", &db.target(), sql, &[json!("2026-01-01")], &QueryLimits::default()).await;
        let result: QueryResult = result.unwrap();
        assert_eq!(result.columns, vec!["id", "email", "name", "created_at"]);
        assert_eq!(result.rows, seed_customers_after_2026(), "{sql}");
        assert!(!result.truncated);
    }
    let sql = "SELECT SUM(total_amount) AS total, COUNT(*) AS n, '$1' AS literal FROM orders WHERE created_at >= $1";
    let total = sources.query("ds_my", &db.target(), sql, &[json!("2026-01-14")], &QueryLimits::default()).await;
    assert_eq!(total.unwrap().rows, vec![vec![json!(1220.49), json!(2), json!("$1")]]);
    let sql = "SELECT CAST('2026-01-15' AS DATE), CAST('-26:03:04' AS TIME), 1.5e0, NULL, x'00ff', JSON_OBJECT('a', 1)";
    let values = sources.query("ds_my", &db.target(), sql, &[], &QueryLimits::default()).await.unwrap();
    assert_eq!(values.rows, vec![vec![json!("2026-01-15"), json!("-26:03:04"), json!(1.5), json!(null), json!("AP8="), json!("{\"a\": 1}")]]);
    let missing = sources.query("ds_my", &db.target(), "SELECT $2", &[json!(1)], &QueryLimits::default()).await;
    assert_code(missing, "bad_parameter");
    let point = sources.query("ds_my", &db.target(), "SELECT POINT(1, 2) AS spot", &[], &QueryLimits::default()).await;
    assert!(assert_code(point, "unsupported_value").to_string().contains("`spot`"));
}

#[tokio::test]
async fn mariadb_refuses_every_write_at_the_database_and_changes_nothing() {
    let db = MariaDb::new().await;
    let sources = sources();
    let before = db.counts().await;
    for write in [
        "INSERT INTO customers VALUES (UUID(), 'x@example.com', 'X', NOW())",
        "UPDATE customers SET name = 'changed'",
        "DELETE FROM orders",
        "DROP TABLE orders",
        "CREATE TABLE extra (id INT)",
        "TRUNCATE TABLE orders",
        "SELECT bump()",
        "CREATE TEMPORARY TABLE scratch (id INT)",
    ] {
        let refused = sources.query("ds_my", &db.target(), write, &[], &QueryLimits::default()).await;
        let refused = assert_code(refused, "read_only");
        assert!(refused.to_string().contains("READ ONLY transaction"), "{write}: {refused}");
    }
    // One statement only: a second one is a syntax error, never run.
    let two = sources.query("ds_my", &db.target(), "SELECT 1; DROP TABLE orders", &[], &QueryLimits::default()).await;
    assert_code(two, "database_error");
    assert_eq!(db.counts().await, before, "nothing was written");
}

#[tokio::test]
async fn mariadb_parameters_never_become_sql() {
    let db = MariaDb::new().await;
    let sources = sources();
    let sql = "SELECT * FROM customers WHERE email = $1";
    for injection in ["' OR 1=1 --", "x'; DROP TABLE customers; --", "\\' OR 1=1 #"] {
        let result = sources.query("ds_my", &db.target(), sql, &[json!(injection)], &QueryLimits::default()).await;
        assert_eq!(result.unwrap().row_count, 0, "{injection}");
    }
    assert_eq!(db.counts().await.0, 3);
}

#[tokio::test]
async fn mariadb_statement_timeout_and_caps() {
    let db = MariaDb::new().await;
    let sources = sources();
    let started = Instant::now();
    let late = sources.query("ds_my", &db.target(), "SELECT SLEEP(10)", &[], &limits(500, 1000, 1 << 20)).await;
    assert_code(late, "timeout");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    let many = "SELECT seq FROM seq_1_to_1000000";
    let capped = sources.query("ds_my", &db.target(), many, &[], &limits(5000, 10, 1 << 20)).await.unwrap();
    assert_eq!((capped.row_count, capped.truncated), (10, true));
    let limited = "SELECT seq FROM seq_1_to_1000000 LIMIT 500000";
    let started = Instant::now();
    let capped = sources.query("ds_my", &db.target(), limited, &[], &limits(5000, 10, 1 << 20)).await.unwrap();
    assert_eq!((capped.row_count, capped.truncated), (10, true));
    assert!(started.elapsed() < Duration::from_secs(2), "the rest is not read: {:?}", started.elapsed());
    let wide = "SELECT REPEAT('x', 1000) FROM seq_1_to_100000";
    let bytes = sources.query("ds_my", &db.target(), wide, &[], &limits(5000, 100_000, 10 * 1024)).await.unwrap();
    assert!(bytes.truncated && bytes.row_count == 10, "{} rows", bytes.row_count);
    // The pool recovers from the connections closed above.
    let next = sources.query("ds_my", &db.target(), "SELECT COUNT(*) FROM customers", &[], &QueryLimits::default()).await;
    assert_eq!(next.unwrap().rows, vec![vec![json!(3)]]);
}

#[tokio::test]
async fn mariadb_wrong_password_is_refused_without_the_password() {
    let db = MariaDb::new().await;
    let wrong = sql_target(SourceType::Mysql, 3306, &db.name, None, "wrong-pass-7f3a9c");
    let refused = assert_code(sources().check("ds_my", &wrong).await, "auth_failed");
    let shown = format!("{refused} {refused:?} {wrong:?}");
    assert!(shown.contains("Access denied"), "{shown}");
    assert!(!shown.contains("wrong-pass-7f3a9c") && !shown.contains(PASSWORD), "{shown}");
    sources().check("ds_my", &db.target()).await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// REST

/// A small JSON API on loopback: `/v1/users` (bearer token required), a wrapped list, a large
/// answer, a slow one, an HTML page; every request's method and URI is kept.
pub(crate) struct RestApi {
    pub(crate) base_url: String,
    pub(crate) seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    _server: tokio::task::JoinHandle<()>,
}

pub(crate) async fn rest_api() -> RestApi {
    use axum::http::{HeaderMap, Method, StatusCode, Uri};
    use axum::response::{Html, IntoResponse, Response};
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push(format!("{method} {uri}"));
            if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some("Bearer rest-token-55aa") {
                return StatusCode::UNAUTHORIZED.into_response();
            }
            let users = json!([
                {"id": 1, "name": "Ann", "active": true},
                {"id": 2, "name": "Bob", "active": false},
                {"id": 3, "name": "Cy", "active": true, "email": "cy@example.com"}
            ]);
            let response: Response = match uri.path() {
                "/v1/users" if uri.query() == Some("active=true") => {
                    axum::Json(json!([users[0].clone(), users[2].clone()])).into_response()
                }
                "/v1/users" => axum::Json(users).into_response(),
                "/v1/wrapped" => axum::Json(json!({"data": users, "next": null})).into_response(),
                "/v1/big" => axum::Json(json!(["x".repeat(100_000)])).into_response(),
                "/v1/slow" => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    axum::Json(json!([])).into_response()
                }
                "/v1/page" => Html("<html>not json</html>").into_response(),
                "/v1" | "/v1/" => StatusCode::NOT_FOUND.into_response(),
                path if path.starts_with("/v1/echo/") => axum::Json(json!([{"path": path}])).into_response(),
                _ => StatusCode::NOT_FOUND.into_response(),
            };
            response
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    RestApi { base_url, seen, _server: server }
}

fn rest_target(api: &RestApi, token: &str) -> SourceTarget {
    let connection = json!({"base_url": api.base_url, "headers": {"Authorization": format!("Bearer {token}")}});
    SourceTarget::new(SourceConnection::from_parts(SourceType::RestApi, connection).unwrap()).allowing_private(true)
}

#[tokio::test]
async fn rest_api_answers_read_as_tables_with_get_only() {
    let api = rest_api().await;
    let sources = sources();
    let target = rest_target(&api, "rest-token-55aa");
    sources.check("ds_rest", &target).await.unwrap();
    assert_eq!(sources.extract_schema("ds_rest", &target).await.unwrap(), vec![]);
    let active = sources.query("ds_rest", &target, "/users?active=true", &[], &QueryLimits::default()).await.unwrap();
    assert_eq!(active.columns, vec!["active", "id", "name", "email"]);
    assert_eq!(active.rows[1], vec![json!(true), json!(3), json!("Cy"), json!("cy@example.com")]);
    assert_eq!(active.rows[0][3], json!(null));
    let wrapped = sources.query("ds_rest", &target, "/wrapped", &[], &limits(5000, 2, 1 << 20)).await.unwrap();
    assert_eq!((wrapped.row_count, wrapped.truncated), (2, true));
    let echoed = sources.query("ds_rest", &target, "/echo/$1", &[json!("a b/../../admin?x=1")], &QueryLimits::default()).await;
    assert_eq!(echoed.unwrap().rows, vec![vec![json!("/v1/echo/a%20b%2F%2E%2E%2F%2E%2E%2Fadmin%3Fx%3D1")]]);
    let seen = api.seen.lock().unwrap().clone();
    assert!(seen.iter().all(|request| request.starts_with("GET /v1")), "{seen:?}");
}

#[tokio::test]
async fn rest_api_failures_are_named() {
    let api = rest_api().await;
    let sources = sources();
    let target = rest_target(&api, "rest-token-55aa");
    let q = |path: &'static str, limits: QueryLimits| {
        let (sources, target) = (&sources, &target);
        async move { sources.query("ds_rest", target, path, &[], &limits).await }
    };
    assert_code(q("/big", limits(5000, 1000, 10 * 1024)).await, "too_large");
    let started = Instant::now();
    assert_code(q("/slow", limits(500, 1000, 1 << 20)).await, "timeout");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_code(q("/page", QueryLimits::default()).await, "bad_answer");
    assert_code(q("/nothing-here", QueryLimits::default()).await, "bad_answer");
    assert_code(q("/../admin", QueryLimits::default()).await, "bad_parameter");
    assert_code(q("users", QueryLimits::default()).await, "bad_parameter");
    let wrong = rest_target(&api, "not-the-token-99");
    let refused = assert_code(sources.query("ds_rest", &wrong, "/users", &[], &QueryLimits::default()).await, "auth_failed");
    assert!(!format!("{refused} {refused:?} {wrong:?}").contains("not-the-token-99"));
    assert_code(sources.check("ds_rest", &wrong).await, "auth_failed");
    let private = rest_target(&api, "rest-token-55aa").allowing_private(false);
    assert_code(sources.query("ds_rest_private", &private, "/users", &[], &QueryLimits::default()).await, "private_address");
    let mut named = private.clone();
    if let SourceConnection::RestApi(rest) = &mut named.connection {
        rest.base_url = rest.base_url.replace("127.0.0.1", "localhost");
    }
    assert_code(sources.query("ds_rest_named", &named, "/users", &[], &QueryLimits::default()).await, "private_address");
}
