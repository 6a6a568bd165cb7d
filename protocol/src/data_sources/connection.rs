//! A data source's connection: validated field by field, printed without its secrets, and sealed
//! for storage with the fleet's secrets key (the password and every header value, nothing else).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::SourceType;
use crate::secrets::{SecretsError, SecretsKey};

/// What a secret is shown as, in an API answer or a `Debug` print.
const HIDDEN: &str = "****";

/// A PostgreSQL or MySQL/MariaDB server. `password` is plaintext in memory only: stored, it is
/// sealed ([`SourceConnection::seal`]); printed, it is `****`.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SqlConnection {
    /// A DNS name or an IP address (no Unix socket path): it goes through the private-address
    /// policy.
    pub host: String,
    /// 1–65535.
    pub port: u32,
    pub database: String,
    pub username: String,
    #[serde(default)]
    pub password: String,
    /// PostgreSQL only: the one schema to read and to query unqualified (its `search_path`).
    /// Without it, every schema but the system's is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
}

impl std::fmt::Debug for SqlConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlConnection")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("database", &self.database)
            .field("username", &self.username)
            .field("password", &HIDDEN)
            .field("schema", &self.schema)
            .finish()
    }
}

/// A REST API: a base URL and the headers sent with every request (an `Authorization`, say),
/// whose values are secrets like a password.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RestConnection {
    /// Absolute http(s), with a host; no credentials, query or fragment.
    pub base_url: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

impl std::fmt::Debug for RestConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: BTreeMap<&str, &str> = self.headers.keys().map(|k| (k.as_str(), HIDDEN)).collect();
        f.debug_struct("RestConnection").field("base_url", &self.base_url).field("headers", &headers).finish()
    }
}

/// A source's type with its connection, in the registration's own shape:
/// `{"type": "postgresql", "connection": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", content = "connection", rename_all = "snake_case", deny_unknown_fields)]
pub enum SourceConnection {
    Postgresql(SqlConnection),
    Mysql(SqlConnection),
    RestApi(RestConnection),
}

/// A connection whose password and header values are AES-GCM ciphertexts bound to their owner
/// (the source's id): what is stored. Only [`SealedConnection::open`] gives the secrets back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SealedConnection(SourceConnection);

/// A connection field that is missing, malformed or out of bounds, named as `connection.<field>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("connection{dot}{field} {reason}", dot = if self.field.is_empty() { "" } else { "." })]
pub struct ConnectionError {
    pub field: String,
    pub reason: String,
}

fn refuse(field: &str, reason: impl Into<String>) -> ConnectionError {
    ConnectionError { field: field.to_string(), reason: reason.into() }
}

impl SourceConnection {
    /// The connection a registration's `type` and `connection` describe, validated.
    pub fn from_parts(source_type: SourceType, connection: serde_json::Value) -> Result<Self, ConnectionError> {
        let read =
            |e: serde_json::Error| refuse("", format!("is not a valid {} connection: {e}", source_type.as_str()));
        let parsed = match source_type {
            SourceType::Postgresql => SourceConnection::Postgresql(serde_json::from_value(connection).map_err(read)?),
            SourceType::Mysql => SourceConnection::Mysql(serde_json::from_value(connection).map_err(read)?),
            SourceType::RestApi => SourceConnection::RestApi(serde_json::from_value(connection).map_err(read)?),
        };
        parsed.validate()?;
        Ok(parsed)
    }

    pub fn source_type(&self) -> SourceType {
        match self {
            SourceConnection::Postgresql(_) => SourceType::Postgresql,
            SourceConnection::Mysql(_) => SourceType::Mysql,
            SourceConnection::RestApi(_) => SourceType::RestApi,
        }
    }

    /// Every field within its rules, or an error naming the first that is not.
    pub fn validate(&self) -> Result<(), ConnectionError> {
        match self {
            SourceConnection::Postgresql(sql) => validate_sql(sql, true),
            SourceConnection::Mysql(sql) => validate_sql(sql, false),
            SourceConnection::RestApi(rest) => validate_rest(rest),
        }
    }

    /// The texts no error, log line or answer may hold: the password, each header value, and a
    /// header value's words (a bearer's token without `Bearer `), longest first.
    pub fn secrets(&self) -> Vec<String> {
        let mut secrets: Vec<String> = Vec::new();
        match self {
            SourceConnection::Postgresql(sql) | SourceConnection::Mysql(sql) => secrets.push(sql.password.clone()),
            SourceConnection::RestApi(rest) => {
                for value in rest.headers.values() {
                    secrets.push(value.clone());
                    let words: Vec<&str> = value.split_whitespace().collect();
                    // An authorization's scheme (`Bearer`, `Basic`) is no secret: its other words are.
                    let scheme = words.len() > 1 && words[0].chars().all(|c| c.is_ascii_alphabetic());
                    secrets.extend(words.iter().skip(usize::from(scheme)).map(|w| w.to_string()));
                }
            }
        }
        // A short word ("Bearer", "x") is no secret and would only garble the text it is cut from.
        secrets.retain(|s| s.chars().count() >= 4);
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        secrets
    }

    /// The connection as an API answer shows it: secrets as `****` (an empty password stays
    /// empty, so a reader can tell it is unset).
    pub fn shown(&self) -> SourceConnection {
        self.map_secrets(|s| if s.is_empty() { String::new() } else { HIDDEN.to_string() })
    }

    /// The connection to store: its secrets encrypted under `key`, bound to `owner`.
    pub fn seal(&self, key: &SecretsKey, owner: &str) -> SealedConnection {
        // An empty secret stays empty, so a stored connection still says it has none.
        SealedConnection(self.map_secrets(|s| if s.is_empty() { String::new() } else { key.encrypt(owner, s) }))
    }

    fn map_secrets(&self, mut f: impl FnMut(&str) -> String) -> SourceConnection {
        let mut copy = self.clone();
        match &mut copy {
            SourceConnection::Postgresql(sql) | SourceConnection::Mysql(sql) => sql.password = f(&sql.password),
            SourceConnection::RestApi(rest) => rest.headers.values_mut().for_each(|v| *v = f(v)),
        }
        copy
    }
}

impl SealedConnection {
    /// The connection with its secrets decrypted: for the worker's memory only.
    pub fn open(&self, key: &SecretsKey, owner: &str) -> Result<SourceConnection, SecretsError> {
        let open = |sealed: &mut String| -> Result<(), SecretsError> {
            if !sealed.is_empty() {
                *sealed = key.decrypt(owner, sealed)?;
            }
            Ok(())
        };
        let mut opened = self.0.clone();
        match &mut opened {
            SourceConnection::Postgresql(sql) | SourceConnection::Mysql(sql) => open(&mut sql.password)?,
            SourceConnection::RestApi(rest) => rest.headers.values_mut().try_for_each(open)?,
        }
        Ok(opened)
    }

    /// The sealed connection's type (its other fields are plain).
    pub fn source_type(&self) -> SourceType {
        self.0.source_type()
    }

    /// The connection as an API answer shows it, without opening it.
    pub fn shown(&self) -> SourceConnection {
        self.0.shown()
    }
}

fn name_field(field: &str, value: &str, max: usize) -> Result<(), ConnectionError> {
    if value.is_empty() {
        return Err(refuse(field, "must not be empty"));
    }
    if value.chars().count() > max {
        return Err(refuse(field, format!("must be at most {max} characters")));
    }
    if value.chars().any(char::is_control) {
        return Err(refuse(field, "must not contain control characters"));
    }
    Ok(())
}

fn validate_sql(sql: &SqlConnection, postgres: bool) -> Result<(), ConnectionError> {
    name_field("host", &sql.host, 253)?;
    // A path would be a Unix socket: a connection the private-address policy cannot see.
    if sql.host.contains(['/', '\\', '@', ' ']) {
        return Err(refuse("host", "must be a DNS name or an IP address"));
    }
    if !(1..=65535).contains(&sql.port) {
        return Err(refuse("port", "must be between 1 and 65535"));
    }
    name_field("database", &sql.database, 64)?;
    name_field("username", &sql.username, 64)?;
    if sql.password.chars().count() > 1024 || sql.password.contains('\0') {
        return Err(refuse("password", "must be at most 1024 characters, without NUL"));
    }
    match (&sql.schema, postgres) {
        (None, _) => Ok(()),
        (Some(schema), true) => name_field("schema", schema, 63),
        (Some(_), false) => Err(refuse("schema", "applies to postgresql only (a MySQL schema is its database)")),
    }
}

/// Header names a source may not set: the HTTP client's own framing.
const RESERVED_HEADERS: [&str; 5] = ["host", "content-length", "transfer-encoding", "connection", "upgrade"];

fn validate_rest(rest: &RestConnection) -> Result<(), ConnectionError> {
    if rest.base_url.len() > 2048 || rest.base_url.chars().any(char::is_control) {
        return Err(refuse("base_url", "must be at most 2048 characters, without control characters"));
    }
    let url = url::Url::parse(&rest.base_url).map_err(|e| refuse("base_url", format!("is not a valid URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(refuse("base_url", "must be an http or https URL with a host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(refuse("base_url", "must not carry credentials (send them as a header)"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(refuse("base_url", "must not have a query or a fragment"));
    }
    if rest.headers.len() > 32 {
        return Err(refuse("headers", "must be at most 32"));
    }
    for (name, value) in &rest.headers {
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || name.len() > 128 || !name.bytes().all(token) {
            return Err(refuse("headers", format!("{name:?} is not a header name")));
        }
        if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            return Err(refuse("headers", format!("{name} is set by the HTTP client itself")));
        }
        // Never echo the value: it is a secret.
        if value.len() > 8192 || !value.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)) {
            return Err(refuse("headers", format!("the value of {name} cannot be sent (visible ASCII only)")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn postgres() -> serde_json::Value {
        json!({"host": "db.example.com", "port": 5432, "database": "sales", "username": "readonly_user", "password": "secure_password"})
    }

    #[test]
    fn the_seeds_registration_reads_as_a_postgresql_connection() {
        let connection = SourceConnection::from_parts(SourceType::Postgresql, postgres()).unwrap();
        assert_eq!(connection.source_type(), SourceType::Postgresql);
        let tagged: SourceConnection =
            serde_json::from_value(json!({"type": "postgresql", "connection": postgres()})).unwrap();
        assert_eq!(tagged, connection);
        assert_eq!(serde_json::to_value(&connection).unwrap()["connection"]["host"], "db.example.com");
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases = [
            ("host", json!("")),
            ("host", json!("/var/run/postgresql")),
            ("port", json!(0)),
            ("port", json!(70000)),
            ("database", json!("")),
            ("username", json!("a\nb")),
        ];
        for (field, value) in cases {
            let mut connection = postgres();
            connection[field] = value;
            let e = SourceConnection::from_parts(SourceType::Postgresql, connection).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.to_string().starts_with(&format!("connection.{field} ")), "{e}");
        }
        let mut mysql = postgres();
        mysql["schema"] = json!("public");
        assert_eq!(SourceConnection::from_parts(SourceType::Mysql, mysql).unwrap_err().field, "schema");
        let missing = SourceConnection::from_parts(SourceType::Mysql, json!({"host": "h"})).unwrap_err();
        assert!(missing.to_string().contains("missing field"), "{missing}");
    }

    #[test]
    fn rest_connections_are_checked() {
        let ok = json!({"base_url": "https://api.example.com/v1", "headers": {"Authorization": "Bearer tok-123456"}});
        assert!(SourceConnection::from_parts(SourceType::RestApi, ok).is_ok());
        for (base_url, headers) in [
            ("ftp://api.example.com", json!({})),
            ("https://user:pw@api.example.com", json!({})),
            ("https://api.example.com/v1?x=1", json!({})),
            ("not a url", json!({})),
            ("https://api.example.com", json!({"Bad Name": "x"})),
            ("https://api.example.com", json!({"Host": "elsewhere"})),
            ("https://api.example.com", json!({"X-Token": "a\r\nInjected: yes"})),
        ] {
            let connection = json!({"base_url": base_url, "headers": headers});
            let e = SourceConnection::from_parts(SourceType::RestApi, connection).unwrap_err();
            assert!(matches!(e.field.as_str(), "base_url" | "headers"), "{e}");
            assert!(!e.to_string().contains("Injected"), "{e}");
        }
    }

    #[test]
    fn secrets_never_print_and_are_sealed_and_opened() {
        let sql = SourceConnection::from_parts(SourceType::Postgresql, postgres()).unwrap();
        let rest = SourceConnection::from_parts(
            SourceType::RestApi,
            json!({"base_url": "https://api.example.com", "headers": {"Authorization": "Bearer tok-123456"}}),
        )
        .unwrap();
        for connection in [&sql, &rest] {
            let printed = format!("{connection:?} {:?}", connection.shown());
            assert!(!printed.contains("secure_password") && !printed.contains("tok-123456"), "{printed}");
            assert!(serde_json::to_string(&connection.shown()).unwrap().contains("****"));
        }
        assert_eq!(rest.secrets(), vec!["Bearer tok-123456".to_string(), "tok-123456".to_string()]);
        let key = SecretsKey::parse(&"11".repeat(32)).unwrap();
        let sealed = sql.seal(&key, "ds_abc");
        let stored = serde_json::to_string(&sealed).unwrap();
        assert!(!stored.contains("secure_password") && stored.contains("db.example.com"), "{stored}");
        let read: SealedConnection = serde_json::from_str(&stored).unwrap();
        assert_eq!(read.open(&key, "ds_abc").unwrap(), sql);
        assert!(read.open(&key, "ds_other").is_err(), "bound to its owner");
        assert_eq!(rest.seal(&key, "ds_r").open(&key, "ds_r").unwrap(), rest);
    }
}
