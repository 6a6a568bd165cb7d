//! Why a data-source operation failed, sorted by what the caller does next (fix the source, fix
//! the query, try again later), in words safe to store: sanitised, and never holding a secret.

use fleet_protocol::data_sources::{ConnectionError, TypeRefused};
use fleet_protocol::sanitize::sanitize_error;

/// A data-source failure. Every text in it passed [`scrub`]: one line, no password or header value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataSourceError {
    /// The connection or the limits are not usable as given (a field named).
    #[error("the data source is not configured right: {0}")]
    BadTarget(String),
    /// A type this fleet has no driver for.
    #[error("{0}")]
    Unsupported(String),
    /// The host is (or resolves to) a loopback, private, link-local or metadata address, and the
    /// operator has not allowed private networks.
    #[error("data source host {host} is a loopback, private, link-local or metadata address, which is not allowed")]
    PrivateAddress { host: String },
    /// Nothing answered: no DNS name, refused, unreachable, or silent past the connect timeout.
    #[error("the data source could not be reached: {0}")]
    Unreachable(String),
    /// The server refused the credentials.
    #[error("the data source refused the credentials: {0}")]
    AuthFailed(String),
    /// Every connection of the source was in use for longer than the wait allowed.
    #[error("all {max_connections} connections to the data source are in use")]
    Busy { max_connections: u32 },
    /// The statement (or the REST request) ran past its timeout and was cancelled.
    #[error("the query ran past its statement timeout of {timeout_ms} ms and was cancelled")]
    Timeout { timeout_ms: u64 },
    /// The database refused a write: the query ran in a read-only transaction.
    #[error("the data source is read-only: {0}")]
    ReadOnly(String),
    /// The database refused the query otherwise (a syntax error, an unknown table, a bad cast).
    #[error("the database refused the query: {0}")]
    Database(String),
    /// The parameters do not fit the query (count, kind).
    #[error("bad query parameters: {0}")]
    BadParameter(String),
    /// A column's type has no JSON rendering.
    #[error("column `{column}` has type {type_name}, which cannot be rendered as JSON: cast it to text in the query (PostgreSQL `{column}::text`, MySQL `CAST({column} AS CHAR)`)")]
    UnsupportedValue { column: String, type_name: String },
    /// A REST answer's body was larger than `max_bytes` (a JSON document cannot be read in part).
    #[error("the answer is larger than {max_bytes} bytes")]
    TooLarge { max_bytes: u64 },
    /// A REST API answered with an error status, or with something that is not JSON.
    #[error("the API answered badly: {0}")]
    BadAnswer(String),
    /// The connection was lost while the query ran.
    #[error("the connection to the data source was lost: {0}")]
    ConnectionLost(String),
}

impl DataSourceError {
    /// A stable code for an API answer or a tool result.
    pub fn code(&self) -> &'static str {
        match self {
            DataSourceError::BadTarget(_) => "bad_target",
            DataSourceError::Unsupported(_) => "unsupported_type",
            DataSourceError::PrivateAddress { .. } => "private_address",
            DataSourceError::Unreachable(_) => "unreachable",
            DataSourceError::AuthFailed(_) => "auth_failed",
            DataSourceError::Busy { .. } => "busy",
            DataSourceError::Timeout { .. } => "timeout",
            DataSourceError::ReadOnly(_) => "read_only",
            DataSourceError::Database(_) => "database_error",
            DataSourceError::BadParameter(_) => "bad_parameter",
            DataSourceError::UnsupportedValue { .. } => "unsupported_value",
            DataSourceError::TooLarge { .. } => "too_large",
            DataSourceError::BadAnswer(_) => "bad_answer",
            DataSourceError::ConnectionLost(_) => "connection_lost",
        }
    }

    /// The HTTP status an API route answers with: 422 for what the request got wrong (the source
    /// or the query), 502 for a source that failed, 503 for one that is busy, 504 for a timeout.
    pub fn http_status(&self) -> u16 {
        match self {
            DataSourceError::BadTarget(_)
            | DataSourceError::Unsupported(_)
            | DataSourceError::PrivateAddress { .. }
            | DataSourceError::AuthFailed(_)
            | DataSourceError::ReadOnly(_)
            | DataSourceError::Database(_)
            | DataSourceError::BadParameter(_)
            | DataSourceError::UnsupportedValue { .. }
            | DataSourceError::TooLarge { .. } => 422,
            DataSourceError::Unreachable(_) | DataSourceError::BadAnswer(_) | DataSourceError::ConnectionLost(_) => 502,
            DataSourceError::Busy { .. } => 503,
            DataSourceError::Timeout { .. } => 504,
        }
    }

    /// Whether the same query may succeed later unchanged (the source was down, busy or lost).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            DataSourceError::Unreachable(_) | DataSourceError::Busy { .. } | DataSourceError::ConnectionLost(_)
        )
    }
}

/// A type refused by `SourceType::parse`, as the client's error (for a caller that maps both).
impl From<TypeRefused> for DataSourceError {
    fn from(refused: TypeRefused) -> Self {
        DataSourceError::Unsupported(refused.to_string())
    }
}

/// A connection field refused by its validation.
impl From<ConnectionError> for DataSourceError {
    fn from(e: ConnectionError) -> Self {
        DataSourceError::BadTarget(e.to_string())
    }
}

/// Text fit for an error: every secret replaced by `****`, then sanitised to one short line.
pub(crate) fn scrub(text: &str, secrets: &[String]) -> String {
    let mut text = text.to_string();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        text = text.replace(secret.as_str(), "****");
    }
    sanitize_error(&text)
}

/// The whole chain of an error as one line (drivers' outer messages rarely say the cause).
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![error.to_string()];
    let mut source = error.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_reach_an_error() {
        let secrets = vec!["hunter2-secret".to_string()];
        let text = scrub("password authentication failed: hunter2-secret\nline two", &secrets);
        assert_eq!(text, "password authentication failed: **** line two");
    }

    #[test]
    fn codes_and_statuses_are_stable() {
        let read_only = DataSourceError::ReadOnly("cannot execute INSERT in a read-only transaction".into());
        assert_eq!((read_only.code(), read_only.http_status()), ("read_only", 422));
        assert_eq!(
            read_only.to_string(),
            "the data source is read-only: cannot execute INSERT in a read-only transaction"
        );
        let timeout = DataSourceError::Timeout { timeout_ms: 500 };
        assert_eq!((timeout.code(), timeout.http_status(), timeout.is_transient()), ("timeout", 504, false));
        assert!(DataSourceError::Busy { max_connections: 4 }.is_transient());
        let refused = DataSourceError::from(fleet_protocol::data_sources::SourceType::parse("mssql").unwrap_err());
        assert_eq!((refused.code(), refused.http_status()), ("unsupported_type", 422));
        assert!(refused.to_string().contains("`mssql` is not supported by this fleet"), "{refused}");
        let cast = DataSourceError::UnsupportedValue { column: "area".into(), type_name: "polygon".into() };
        assert!(cast.to_string().contains("`area::text`") && cast.to_string().contains("polygon"), "{cast}");
    }
}
