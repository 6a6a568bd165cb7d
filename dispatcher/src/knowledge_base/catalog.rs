//! The services catalog's pure parts: an operator's catalog file read from its text and checked
//! (its shape, unique ids, and no field that could hold a secret), and a service as the API shows
//! it, made from a catalog entry, a registered MCP server or a registered callback tool.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use fleet_platform::store::{StoredMcpServer, StoredTool};

/// Entries one catalog file may hold.
pub const MAX_ENTRIES: usize = 10_000;
/// The longest description, in characters (an MCP server's, made of its tools', is cut there).
const MAX_DESCRIPTION: usize = 4096;
const MAX_CAPABILITIES: usize = 256;
const MAX_SCOPES: usize = 100;

/// How a client authenticates to a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuthType {
    /// OAuth 2.0: `GET /v1/knowledge-base/services/{id}/oauth` answers its endpoints and scopes.
    Oauth2,
    /// An API key.
    ApiKey,
    /// A bearer token (an MCP server registered with an `Authorization` header).
    Bearer,
    /// HTTP basic authentication.
    Basic,
    /// Requests signed with a shared secret (a callback tool: the fleet signs each call).
    Hmac,
    /// No authentication.
    #[serde(rename = "none")]
    Open,
}

impl AuthType {
    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthType::Oauth2 => "oauth2",
            AuthType::ApiKey => "api_key",
            AuthType::Bearer => "bearer",
            AuthType::Basic => "basic",
            AuthType::Hmac => "hmac",
            AuthType::Open => "none",
        }
    }
}

/// Where the fleet knows a service from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ServiceSource {
    /// The operator's catalog file (`FLEET_SERVICES_CATALOG`).
    Catalog,
    /// A registered MCP server (`/v1/mcp_servers`); its capabilities are its tools.
    McpServer,
    /// A registered callback tool (`/v1/tools`).
    Tool,
}

/// A catalog service's OAuth 2.0 endpoints and scopes. The client's credentials are never here:
/// a field named like a secret stops the dispatcher at start.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogOAuth {
    pub authorization_url: String,
    pub token_url: String,
    #[serde(default)]
    pub scopes: Vec<String>,
}

/// One entry of the operator's catalog file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogEntry {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub auth_type: AuthType,
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Required for `oauth2`, refused for any other `auth_type`.
    #[serde(default)]
    pub oauth: Option<CatalogOAuth>,
}

/// Why a catalog file was refused; the caller names the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("is not JSON: {0}")]
    NotJson(String),
    #[error("must be a JSON array of services, not {0}")]
    NotAnArray(&'static str),
    #[error("holds {0} entries; at most {MAX_ENTRIES}")]
    TooMany(usize),
    #[error("entry {entry}: {why}")]
    Entry { entry: String, why: String },
}

/// A service an assistant can connect to, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[schema(as = Service)]
pub struct ServiceOut {
    /// 1-64 letters, digits, `_` or `-`: a catalog entry's id, an MCP server's name or a tool's.
    pub id: String,
    pub name: String,
    pub description: String,
    pub auth_type: AuthType,
    /// What it can do: a catalog entry's list, an MCP server's tools (their fleet names), a
    /// tool's own name.
    pub capabilities: Vec<String>,
    pub source: ServiceSource,
}

/// A search's answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ServiceMatches {
    /// Best match first.
    pub services: Vec<ServiceOut>,
}

/// An `oauth2` service's OAuth configuration: where a client sends its user and trades the code.
/// No client secret is ever part of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[schema(as = ServiceOAuth)]
pub struct ServiceOAuthOut {
    pub service_id: String,
    pub name: String,
    /// Always `oauth2`.
    pub auth_type: AuthType,
    pub authorization_url: String,
    pub token_url: String,
    pub scopes: Vec<String>,
}

impl ServiceOAuthOut {
    /// The OAuth configuration of `entry`, if it is an `oauth2` service.
    pub fn of(entry: &CatalogEntry) -> Option<Self> {
        let oauth = entry.oauth.as_ref().filter(|_| entry.auth_type == AuthType::Oauth2)?;
        Some(ServiceOAuthOut {
            service_id: entry.id.clone(),
            name: entry.name.clone(),
            auth_type: AuthType::Oauth2,
            authorization_url: oauth.authorization_url.clone(),
            token_url: oauth.token_url.clone(),
            scopes: oauth.scopes.clone(),
        })
    }
}

/// Whether `id` can name a service: 1-64 letters, digits, `_` or `-` (as tool and MCP server
/// names are), so it is one path segment as it is.
pub fn is_service_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether a field's name says it holds a secret: `client_secret`, `clientSecret`, `password`,
/// `api_key`, `refresh_token`, `token`, … (`token_url` and `auth_type` do not).
pub fn names_a_secret(field: &str) -> bool {
    const PARTS: [&str; 10] = [
        "secret",
        "password",
        "passwd",
        "passphrase",
        "apikey",
        "privatekey",
        "accesstoken",
        "refreshtoken",
        "credential",
        "clientkey",
    ];
    const WHOLE: [&str; 5] = ["token", "pwd", "pass", "key", "bearer"];
    let word: String = field.chars().filter(char::is_ascii_alphanumeric).map(|c| c.to_ascii_lowercase()).collect();
    PARTS.iter().any(|part| word.contains(part)) || WHOLE.contains(&word.as_str())
}

/// The path of the first field under `value` whose name says it holds a secret.
fn secret_field(value: &Value, at: &str) -> Option<String> {
    match value {
        Value::Object(map) => map.iter().find_map(|(name, inner)| {
            let path = if at.is_empty() { name.clone() } else { format!("{at}.{name}") };
            if names_a_secret(name) {
                Some(path)
            } else {
                secret_field(inner, &path)
            }
        }),
        Value::Array(items) => {
            items.iter().enumerate().find_map(|(i, inner)| secret_field(inner, &format!("{at}[{i}]")))
        }
        _ => None,
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Reads and checks a catalog file's text: a JSON array of entries, each well-formed, its id
/// unique, and no field anywhere named like a secret.
pub fn parse_catalog(text: &str) -> Result<Vec<CatalogEntry>, CatalogError> {
    let value: Value = serde_json::from_str(text).map_err(|e| CatalogError::NotJson(e.to_string()))?;
    let Value::Array(items) = value else { return Err(CatalogError::NotAnArray(json_kind(&value))) };
    if items.len() > MAX_ENTRIES {
        return Err(CatalogError::TooMany(items.len()));
    }
    let mut first_of: HashMap<String, usize> = HashMap::new();
    let mut entries = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let entry = checked_entry(i, item)?;
        if let Some(first) = first_of.insert(entry.id.clone(), i) {
            let why = format!("its id is also entry [{first}]'s; every id must be unique");
            return Err(CatalogError::Entry { entry: entry_label(i, Some(&entry.id)), why });
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// How an error names entry `i`: its place, and its id when it has one.
fn entry_label(i: usize, id: Option<&str>) -> String {
    match id {
        Some(id) => format!("[{i}] (id {:?})", id.chars().take(80).collect::<String>()),
        None => format!("[{i}]"),
    }
}

fn checked_entry(i: usize, item: Value) -> Result<CatalogEntry, CatalogError> {
    let entry = entry_label(i, item.get("id").and_then(Value::as_str));
    if let Some(field) = secret_field(&item, "") {
        let why = format!(
            "field {field:?} is named like a secret; a catalog holds no secret (OAuth client credentials stay with \
             whoever runs the OAuth flow)"
        );
        return Err(CatalogError::Entry { entry, why });
    }
    let parsed: CatalogEntry = serde_path_to_error::deserialize(item).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let why = if path == "." { inner } else { format!("{path}: {inner}") };
        CatalogError::Entry { entry: entry.clone(), why }
    })?;
    match parsed.problem() {
        Some(why) => Err(CatalogError::Entry { entry, why }),
        None => Ok(parsed),
    }
}

fn has_control(text: &str) -> bool {
    text.chars().any(char::is_control)
}

impl CatalogEntry {
    /// What is wrong with the entry, if anything (its shape is serde's to check).
    pub fn problem(&self) -> Option<String> {
        if !is_service_id(&self.id) {
            return Some("id must be 1-64 letters, digits, '_' or '-'".into());
        }
        if self.name.trim().is_empty() || self.name.chars().count() > 200 || has_control(&self.name) {
            return Some("name must be 1-200 characters without control characters".into());
        }
        if self.description.chars().count() > MAX_DESCRIPTION {
            return Some(format!("description is longer than {MAX_DESCRIPTION} characters"));
        }
        if self.capabilities.len() > MAX_CAPABILITIES {
            return Some(format!("capabilities holds more than {MAX_CAPABILITIES}"));
        }
        let bad = |c: &&String| c.trim().is_empty() || c.chars().count() > 128 || has_control(c);
        if let Some(c) = self.capabilities.iter().find(bad) {
            return Some(format!("capability {c:?} must be 1-128 characters without control characters"));
        }
        match (self.auth_type, &self.oauth) {
            (AuthType::Oauth2, None) => {
                Some("auth_type oauth2 needs oauth: {authorization_url, token_url, scopes}".into())
            }
            (AuthType::Oauth2, Some(oauth)) => oauth.problem(),
            (other, Some(_)) => Some(format!("oauth is for auth_type oauth2, not {}", other.as_str())),
            (_, None) => None,
        }
    }
}

impl CatalogOAuth {
    fn problem(&self) -> Option<String> {
        let urls = [("oauth.authorization_url", &self.authorization_url), ("oauth.token_url", &self.token_url)];
        if let Some(why) = urls.iter().find_map(|(field, raw)| url_problem(field, raw)) {
            return Some(why);
        }
        if self.scopes.len() > MAX_SCOPES {
            return Some(format!("oauth.scopes holds more than {MAX_SCOPES}"));
        }
        let bad = |s: &&String| s.is_empty() || s.len() > 512 || s.chars().any(|c| c.is_whitespace() || c.is_control());
        self.scopes.iter().find(bad).map(|s| format!("oauth.scopes: {s:?} must be 1-512 characters without spaces"))
    }
}

/// What is wrong with an OAuth endpoint, if anything: an absolute http(s) URL with a host, and
/// no credential in it (user info, or a query parameter named like a secret).
fn url_problem(field: &str, raw: &str) -> Option<String> {
    let url = match url::Url::parse(raw) {
        Ok(url) => url,
        Err(e) => return Some(format!("{field} is not a URL: {e}")),
    };
    if !matches!(url.scheme(), "https" | "http") || url.host_str().is_none_or(str::is_empty) {
        return Some(format!("{field} must be an http(s) URL with a host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Some(format!("{field} must not carry credentials"));
    }
    let (name, _) = url.query_pairs().find(|(name, _)| names_a_secret(name))?;
    Some(format!("{field}'s query parameter {name:?} is named like a secret; a catalog holds no secret"))
}

impl ServiceOut {
    pub fn from_entry(entry: &CatalogEntry) -> Self {
        ServiceOut {
            id: entry.id.clone(),
            name: entry.name.clone(),
            description: entry.description.clone(),
            auth_type: entry.auth_type,
            capabilities: entry.capabilities.clone(),
            source: ServiceSource::Catalog,
        }
    }

    /// A registered MCP server as a service: its tools are its capabilities, and what they say
    /// they do is what it says. An `Authorization` header means a bearer token; other headers,
    /// an API key.
    pub fn from_mcp_server(server: &StoredMcpServer, tool_descriptions: &[&str]) -> Self {
        let bearer = server.header_names.iter().any(|h| h.eq_ignore_ascii_case("authorization"));
        let auth_type = match (bearer, server.header_names.is_empty()) {
            (true, _) => AuthType::Bearer,
            (false, false) => AuthType::ApiKey,
            (false, true) => AuthType::Open,
        };
        let said: Vec<&str> = tool_descriptions.iter().map(|d| d.trim()).filter(|d| !d.is_empty()).collect();
        let description = if said.is_empty() {
            "An MCP server registered with the fleet.".to_string()
        } else {
            format!("An MCP server registered with the fleet. Its tools: {}", said.join(" "))
        };
        ServiceOut {
            id: server.name.clone(),
            name: server.name.clone(),
            description: description.chars().take(MAX_DESCRIPTION).collect(),
            auth_type,
            capabilities: server.tools.clone(),
            source: ServiceSource::McpServer,
        }
    }

    /// A registered callback tool as a service of one capability, itself.
    pub fn from_tool(tool: &StoredTool) -> Self {
        let description = match tool.description.trim() {
            "" => "A tool registered with the fleet.".to_string(),
            said => said.chars().take(MAX_DESCRIPTION).collect(),
        };
        ServiceOut {
            id: tool.name.clone(),
            name: tool.name.clone(),
            description,
            auth_type: AuthType::Hmac,
            capabilities: vec![tool.name.clone()],
            source: ServiceSource::Tool,
        }
    }
}

/// The descriptions of `server`'s tools among `tools`, in its order.
pub fn tool_descriptions<'a>(server: &StoredMcpServer, tools: &'a [StoredTool]) -> Vec<&'a str> {
    let by_name: HashMap<&str, &str> = tools.iter().map(|t| (t.name.as_str(), t.description.as_str())).collect();
    server.tools.iter().filter_map(|name| by_name.get(name.as_str()).copied()).collect()
}

/// Every service, each id once: the catalog's first, then the MCP servers', then the callback
/// tools' (one whose id an earlier one has is left out). An MCP server's tools are its
/// capabilities, not services of their own, and a client's tools are no service.
pub fn assemble(catalog: &[CatalogEntry], servers: &[StoredMcpServer], tools: &[StoredTool]) -> Vec<ServiceOut> {
    let mut seen = HashSet::new();
    let from_servers = servers.iter().map(|s| ServiceOut::from_mcp_server(s, &tool_descriptions(s, tools)));
    let from_tools = tools.iter().filter(|t| t.execution.is_callback()).map(ServiceOut::from_tool);
    catalog
        .iter()
        .map(ServiceOut::from_entry)
        .chain(from_servers)
        .chain(from_tools)
        .filter(|s| seen.insert(s.id.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn calendar() -> Value {
        json!({"id": "google_calendar", "name": "Google Calendar", "description": "Calendar and scheduling service",
            "auth_type": "oauth2", "capabilities": ["create_event", "list_events"],
            "oauth": {"authorization_url": "https://accounts.google.com/o/oauth2/v2/auth",
                "token_url": "https://oauth2.googleapis.com/token",
                "scopes": ["https://www.googleapis.com/auth/calendar"]}})
    }

    fn refused(entries: Value) -> String {
        parse_catalog(&entries.to_string()).unwrap_err().to_string()
    }

    #[test]
    fn a_good_catalog_is_read_whole() {
        let slack = json!({"id": "slack", "name": "Slack", "auth_type": "api_key", "capabilities": ["post_message"]});
        let entries = parse_catalog(&json!([calendar(), slack]).to_string()).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].oauth.as_ref().unwrap().scopes, ["https://www.googleapis.com/auth/calendar"]);
        assert_eq!((entries[1].auth_type, entries[1].description.as_str()), (AuthType::ApiKey, ""));
        assert_eq!(parse_catalog("[]").unwrap(), vec![]);
        let oauth = ServiceOAuthOut::of(&entries[0]).unwrap();
        assert_eq!(oauth.token_url, "https://oauth2.googleapis.com/token");
        assert!(ServiceOAuthOut::of(&entries[1]).is_none());
    }

    #[test]
    fn a_field_named_like_a_secret_refuses_the_file_naming_the_entry_and_field() {
        for (field, at) in [
            (json!({"client_secret": "s3cr3t"}), "oauth.client_secret"),
            (json!({"clientSecret": "s3cr3t"}), "oauth.clientSecret"),
            (json!({"password": "hunter2"}), "oauth.password"),
            (json!({"extra": [{"api_key": "k"}]}), "oauth.extra[0].api_key"),
        ] {
            let mut entry = calendar();
            for (k, v) in field.as_object().unwrap() {
                entry["oauth"][k] = v.clone();
            }
            let why = refused(json!([entry]));
            assert!(why.starts_with("entry [0] (id \"google_calendar\"): field"), "{why}");
            assert!(why.contains(&format!("{at:?}")) && why.contains("secret"), "{why}");
            assert!(!why.contains("s3cr3t") && !why.contains("hunter2"), "the value is never repeated: {why}");
        }
        let mut top = calendar();
        top["secret"] = json!("x");
        assert!(refused(json!([top])).contains("field \"secret\""));
        let mut query = calendar();
        query["oauth"]["token_url"] = json!("https://o.example/token?client_secret=x");
        assert!(refused(json!([query])).contains("query parameter \"client_secret\""));
        for plain in ["token_url", "auth_type", "authorization_url", "scopes", "capabilities", "description"] {
            assert!(!names_a_secret(plain), "{plain}");
        }
        for secret in ["token", "api-key", "APIKey", "private_key", "refresh_token", "client_credentials", "pwd"] {
            assert!(names_a_secret(secret), "{secret}");
        }
    }

    #[test]
    fn a_malformed_file_or_entry_is_refused_naming_what_is_wrong() {
        assert!(matches!(parse_catalog("{"), Err(CatalogError::NotJson(_))));
        assert_eq!(parse_catalog("{}").unwrap_err(), CatalogError::NotAnArray("an object"));
        let dup = refused(json!([calendar(), calendar()]));
        assert_eq!(dup, "entry [1] (id \"google_calendar\"): its id is also entry [0]'s; every id must be unique");
        let mut no_oauth = calendar();
        no_oauth.as_object_mut().unwrap().remove("oauth");
        assert!(refused(json!([no_oauth])).contains("auth_type oauth2 needs oauth"));
        for (entry, says) in [
            (json!({"id": "a b", "name": "A", "auth_type": "none"}), "id must be"),
            (json!({"id": "a", "name": " ", "auth_type": "none"}), "name must be"),
            (json!({"id": "a", "name": "A", "auth_type": "magic"}), "auth_type: unknown variant"),
            (json!({"id": "a", "name": "A", "auth_type": "none", "color": 1}), "unknown field `color`"),
            (json!({"name": "A", "auth_type": "none"}), "missing field `id`"),
            (json!({"id": "a", "name": "A", "auth_type": "none", "capabilities": [""]}), "capability \"\""),
            (json!({"id": "a", "name": "A", "auth_type": "api_key", "oauth": calendar()["oauth"]}), "not api_key"),
            (json!("slack"), "invalid type"),
        ] {
            let why = refused(json!([calendar(), entry]));
            assert!(why.starts_with("entry [1]") && why.contains(says), "{says}: {why}");
        }
        let mut bad_url = calendar();
        bad_url["oauth"]["authorization_url"] = json!("https://user:pw@o.example/auth");
        assert!(refused(json!([bad_url])).contains("oauth.authorization_url must not carry credentials"));
        bad_url["oauth"]["authorization_url"] = json!("/auth");
        assert!(refused(json!([bad_url])).contains("oauth.authorization_url is not a URL"));
    }

    fn server(name: &str, headers: &[&str], tools: &[&str]) -> StoredMcpServer {
        serde_json::from_value(json!({"name": name, "url": "http://m.example/mcp", "header_names": headers,
            "tools": tools, "max_discovery_pages": 1, "max_capabilities": 1, "created_at_ms": 0, "updated_at_ms": 0}))
        .unwrap()
    }

    fn tool(name: &str, description: &str, execution: Value) -> StoredTool {
        let mut t = json!({"name": name, "description": description, "parameters": {}, "callback_url": "",
            "secret_ciphertext": "v1.x", "created_at_ms": 0, "updated_at_ms": 0});
        if !execution.is_null() {
            t["execution"] = execution;
        }
        serde_json::from_value(t).unwrap()
    }

    #[test]
    fn servers_and_callback_tools_are_services_and_an_id_is_shown_once() {
        let catalog = parse_catalog(&json!([calendar()]).to_string()).unwrap();
        let servers = [server("orders", &["Authorization"], &["orders.lookup"]), server("google_calendar", &[], &[])];
        let tools = [
            tool("orders.lookup", "Looks an order up.", json!({"mcp": {"server": "orders", "tool": "lookup"}})),
            tool("weather", "Today's weather.", Value::Null),
            tool("orders", "Shadowed by the server.", Value::Null),
            tool("location", "The client's.", json!("client")),
        ];
        let services = assemble(&catalog, &servers, &tools);
        let ids: Vec<(&str, ServiceSource)> = services.iter().map(|s| (s.id.as_str(), s.source)).collect();
        assert_eq!(
            ids,
            [
                ("google_calendar", ServiceSource::Catalog),
                ("orders", ServiceSource::McpServer),
                ("weather", ServiceSource::Tool)
            ]
        );
        assert_eq!(services[1].auth_type, AuthType::Bearer);
        assert_eq!(services[1].capabilities, ["orders.lookup"]);
        assert!(services[1].description.ends_with("Its tools: Looks an order up."), "{}", services[1].description);
        assert_eq!(
            (services[2].auth_type, services[2].capabilities.as_slice()),
            (AuthType::Hmac, &["weather".to_string()][..])
        );
        assert_eq!(ServiceOut::from_mcp_server(&server("k", &["X-Api-Key"], &[]), &[]).auth_type, AuthType::ApiKey);
        assert_eq!(ServiceOut::from_mcp_server(&server("k", &[], &[]), &[]).auth_type, AuthType::Open);
        let shown = serde_json::to_value(&services[0]).unwrap();
        assert_eq!(shown["auth_type"], "oauth2");
        assert_eq!(shown["source"], "catalog");
        assert_eq!(serde_json::to_value(AuthType::Open).unwrap(), "none");
    }
}
