//! Data sources (issue 48, seed 000's "Data Sources"): the types a source is registered with, its
//! query limits and their defaults, the schema and result shapes, semantic mappings and what a
//! model is told about a source. Pure: the drivers that reach a database are
//! `fleet_platform::data_sources`.
//!
//! - [`SourceType::parse`] takes `postgresql`, `mysql` (`mariadb` is its alias) and `rest_api`,
//!   and refuses `mssql` and `mongodb` as not supported by this fleet, anything else as unknown.
//! - [`SourceConnection`] is a source's connection, validated field by field
//!   ([`SourceConnection::validate`]); its `Debug` never prints a password or a header value, and
//!   [`SourceConnection::seal`] encrypts exactly those for storage ([`crate::secrets`]).
//! - [`QueryLimits`] bounds every query: statement timeout 5 s, 1,000 rows, 1 MiB of JSON, connect
//!   timeout 5 s, 4 connections per source per worker (each settable per source, within bounds).
//! - [`QueryResult`] is the seed's query answer plus `truncated`.
//! - [`merge_mappings`] checks semantic mappings against the extracted [`Table`]s, and
//!   [`tool_description`] renders tables, columns and mappings for a model, bounded.

mod connection;
mod describe;
mod mapping;
mod placeholders;
mod rest;
mod tool;

use serde::{Deserialize, Serialize};

pub use connection::{ConnectionError, RestConnection, SealedConnection, SourceConnection, SqlConnection};
pub use describe::tool_description;
pub use mapping::{merge_mappings, MappingError, SemanticMapping};
pub use placeholders::{question_mark_placeholders, PlaceholderError, Placeholders};
pub use rest::{json_table, rest_url, JsonTable, RestPathError};
pub use tool::{new_data_source_id, query_tool_parameters, tool_name, EXTRACT_SCHEMA};

/// The kinds of data source this fleet reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SourceType {
    Postgresql,
    /// MySQL or MariaDB (one wire protocol; the driver tells them apart by the server's version).
    Mysql,
    RestApi,
}

/// Why a `type` was refused: each message names the type, for a 422.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TypeRefused {
    /// A type the seed lists that this fleet has no driver for.
    #[error("data source type `{0}` is not supported by this fleet (supported: postgresql, mysql, rest_api)")]
    NotSupported(String),
    #[error("unknown data source type `{0}` (supported: postgresql, mysql, rest_api)")]
    Unknown(String),
}

impl SourceType {
    /// The type a registration names. `mariadb` is taken as `mysql`.
    pub fn parse(text: &str) -> Result<SourceType, TypeRefused> {
        match text {
            "postgresql" => Ok(SourceType::Postgresql),
            "mysql" | "mariadb" => Ok(SourceType::Mysql),
            "rest_api" => Ok(SourceType::RestApi),
            "mssql" | "mongodb" => Err(TypeRefused::NotSupported(text.to_string())),
            _ => {
                // The type is echoed in a 422: a bounded, printable excerpt of it.
                let shown: String = text.chars().filter(|c| !c.is_control()).take(64).collect();
                Err(TypeRefused::Unknown(shown))
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SourceType::Postgresql => "postgresql",
            SourceType::Mysql => "mysql",
            SourceType::RestApi => "rest_api",
        }
    }

    /// The port a SQL source listens on unless told otherwise.
    pub fn default_port(self) -> Option<u16> {
        match self {
            SourceType::Postgresql => Some(5432),
            SourceType::Mysql => Some(3306),
            SourceType::RestApi => None,
        }
    }
}

/// One column as the schema extraction reads it (the seed's GET shape).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Column {
    pub name: String,
    /// The type as the database names it, shortened the way the seed shows (`varchar`,
    /// `timestamp`, `uuid`): see [`pg_type_name`].
    #[serde(rename = "type")]
    pub r#type: String,
    pub nullable: bool,
}

/// One table (or view) with its columns in their declared order. A PostgreSQL table outside the
/// `public` schema, or outside the schema the connection names, is `schema.table`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Table {
    pub name: String,
    pub columns: Vec<Column>,
}

/// What bounds one query, and a source's pool. Every field is optional in JSON (its default is
/// taken) and checked against its bounds by [`QueryLimits::validate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct QueryLimits {
    /// The database cancels a statement running longer (PostgreSQL `statement_timeout`, MariaDB
    /// `max_statement_time`, MySQL `max_execution_time`); a REST request's whole deadline.
    /// Default 5,000; 100–300,000.
    pub statement_timeout_ms: u64,
    /// Rows returned at most; more make the result `truncated`. Default 1,000; 1–100,000.
    pub max_rows: u64,
    /// Bytes of JSON rows returned at most (a REST answer's body, read whole, at most); more make
    /// the result `truncated` (a REST answer too large fails instead). Default 1 MiB; 1 KiB–64 MiB.
    pub max_bytes: u64,
    /// How long reaching the database (TCP, TLS, login) may take. Default 5,000; 100–60,000.
    pub connect_timeout_ms: u64,
    /// Connections one worker keeps to the source at most, which is also how many of its queries
    /// run at once there. Default 4; 1–64.
    pub max_connections: u32,
}

impl QueryLimits {
    pub const DEFAULT_STATEMENT_TIMEOUT_MS: u64 = 5_000;
    pub const DEFAULT_MAX_ROWS: u64 = 1_000;
    pub const DEFAULT_MAX_BYTES: u64 = 1024 * 1024;
    pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 5_000;
    pub const DEFAULT_MAX_CONNECTIONS: u32 = 4;

    /// Each field within its bounds, or an error naming the field and the bounds.
    pub fn validate(&self) -> Result<(), LimitsError> {
        let check = |field: &'static str, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(LimitsError { field, min, max })
            }
        };
        check("statement_timeout_ms", self.statement_timeout_ms, 100, 300_000)?;
        check("max_rows", self.max_rows, 1, 100_000)?;
        check("max_bytes", self.max_bytes, 1024, 64 * 1024 * 1024)?;
        check("connect_timeout_ms", self.connect_timeout_ms, 100, 60_000)?;
        check("max_connections", u64::from(self.max_connections), 1, 64)
    }
}

impl Default for QueryLimits {
    fn default() -> Self {
        QueryLimits {
            statement_timeout_ms: Self::DEFAULT_STATEMENT_TIMEOUT_MS,
            max_rows: Self::DEFAULT_MAX_ROWS,
            max_bytes: Self::DEFAULT_MAX_BYTES,
            connect_timeout_ms: Self::DEFAULT_CONNECT_TIMEOUT_MS,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// A limit out of its bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("limits.{field} must be between {min} and {max}")]
pub struct LimitsError {
    pub field: &'static str,
    pub min: u64,
    pub max: u64,
}

/// A query's answer: the seed's shape, plus `truncated` when a cap stopped the reading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct QueryResult {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<serde_json::Value>>,
    pub row_count: u64,
    pub execution_time_ms: u64,
    /// More rows (or bytes) were there than `max_rows` (or `max_bytes`) let through.
    pub truncated: bool,
}

/// A decimal (PostgreSQL `numeric`, MySQL `DECIMAL`) as JSON: a number when it has at most 15
/// significant digits, which a double holds exactly as written; else, and for `NaN` or an
/// infinity, the decimal's text as a string, so no digit is lost.
pub fn decimal_json(text: &str) -> serde_json::Value {
    let digits = text.trim_start_matches(['-', '+']).replace('.', "");
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len();
    let parsed = text.parse::<f64>().ok().filter(|f| f.is_finite());
    match parsed.and_then(serde_json::Number::from_f64) {
        Some(number) if significant <= 15 && digits.bytes().all(|b| b.is_ascii_digit()) => {
            serde_json::Value::Number(number)
        }
        _ => serde_json::Value::String(text.to_string()),
    }
}

/// A PostgreSQL column's type as `information_schema.columns` gives it (`data_type`, and
/// `udt_name` for arrays and user-defined types), in the seed's short words: `varchar`,
/// `timestamp`, `timestamptz`, `char`, `time`, `timetz`; arrays as `text[]`; user-defined types
/// (`citext`, an enum) by their own name; every other type as `data_type` says (`uuid`, `integer`,
/// `numeric`, `jsonb`).
pub fn pg_type_name(data_type: &str, udt_name: &str) -> String {
    match data_type {
        "character varying" => "varchar".into(),
        "character" => "char".into(),
        "timestamp without time zone" => "timestamp".into(),
        "timestamp with time zone" => "timestamptz".into(),
        "time without time zone" => "time".into(),
        "time with time zone" => "timetz".into(),
        "ARRAY" => format!("{}[]", pg_element_name(udt_name.trim_start_matches('_'))),
        "USER-DEFINED" => udt_name.into(),
        other => other.into(),
    }
}

/// An array's element type by its internal name, in the words [`pg_type_name`] uses.
fn pg_element_name(udt: &str) -> &str {
    match udt {
        "int2" => "smallint",
        "int4" => "integer",
        "int8" => "bigint",
        "float4" => "real",
        "float8" => "double precision",
        "bool" => "boolean",
        "bpchar" => "char",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_parsed_and_refusals_name_the_type() {
        assert_eq!(SourceType::parse("postgresql"), Ok(SourceType::Postgresql));
        assert_eq!(SourceType::parse("mariadb"), Ok(SourceType::Mysql));
        assert_eq!(SourceType::parse("rest_api").map(SourceType::as_str), Ok("rest_api"));
        for refused in ["mssql", "mongodb"] {
            let e = SourceType::parse(refused).unwrap_err();
            assert!(matches!(e, TypeRefused::NotSupported(_)));
            assert!(e.to_string().contains(&format!("`{refused}` is not supported by this fleet")), "{e}");
        }
        let unknown = SourceType::parse("oracle").unwrap_err();
        assert_eq!(unknown.to_string(), "unknown data source type `oracle` (supported: postgresql, mysql, rest_api)");
        assert!(!SourceType::parse("x\ny").unwrap_err().to_string().contains('\n'));
        assert_eq!(serde_json::to_string(&SourceType::RestApi).unwrap(), "\"rest_api\"");
    }

    #[test]
    fn limits_default_as_documented_and_are_bounded() {
        let limits: QueryLimits = serde_json::from_str("{}").unwrap();
        assert_eq!(limits, QueryLimits::default());
        assert_eq!((limits.statement_timeout_ms, limits.max_rows, limits.max_bytes), (5000, 1000, 1 << 20));
        assert_eq!((limits.connect_timeout_ms, limits.max_connections), (5000, 4));
        assert_eq!(limits.validate(), Ok(()));
        let partial: QueryLimits = serde_json::from_str(r#"{"max_rows": 10}"#).unwrap();
        assert_eq!((partial.max_rows, partial.statement_timeout_ms), (10, 5000));
        let zero = QueryLimits { max_connections: 0, ..QueryLimits::default() };
        assert_eq!(zero.validate().unwrap_err().to_string(), "limits.max_connections must be between 1 and 64");
        let slow = QueryLimits { statement_timeout_ms: 3_600_000, ..QueryLimits::default() };
        assert_eq!(slow.validate().unwrap_err().field, "statement_timeout_ms");
        assert!(serde_json::from_str::<QueryLimits>(r#"{"max_row": 10}"#).is_err());
    }

    #[test]
    fn decimals_are_numbers_unless_a_double_would_change_them() {
        use serde_json::json;
        assert_eq!(decimal_json("19.99"), json!(19.99));
        assert_eq!(decimal_json("-0.0001"), json!(-0.0001));
        assert_eq!(decimal_json("1200.00"), json!(1200.0));
        assert_eq!(decimal_json("123456789012345"), json!(123456789012345.0));
        assert_eq!(decimal_json("12345678901234567890.5"), json!("12345678901234567890.5"));
        assert_eq!(decimal_json("NaN"), json!("NaN"));
        assert_eq!(decimal_json("Infinity"), json!("Infinity"));
    }

    #[test]
    fn postgres_types_read_as_the_seed_shows_them() {
        assert_eq!(pg_type_name("character varying", "varchar"), "varchar");
        assert_eq!(pg_type_name("timestamp without time zone", "timestamp"), "timestamp");
        assert_eq!(pg_type_name("uuid", "uuid"), "uuid");
        assert_eq!(pg_type_name("numeric", "numeric"), "numeric");
        assert_eq!(pg_type_name("ARRAY", "_text"), "text[]");
        assert_eq!(pg_type_name("ARRAY", "_int4"), "integer[]");
        assert_eq!(pg_type_name("USER-DEFINED", "citext"), "citext");
    }

    #[test]
    fn a_result_serialises_in_the_seeds_shape() {
        let result = QueryResult {
            columns: vec!["id".into()],
            rows: vec![vec![serde_json::json!("uuid-1")]],
            row_count: 1,
            execution_time_ms: 45,
            truncated: false,
        };
        let json = serde_json::to_value(&result).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"columns": ["id"], "rows": [["uuid-1"]], "row_count": 1, "execution_time_ms": 45, "truncated": false})
        );
        let column =
            serde_json::to_value(Column { name: "id".into(), r#type: "uuid".into(), nullable: false }).unwrap();
        assert_eq!(column, serde_json::json!({"name": "id", "type": "uuid", "nullable": false}));
    }
}
