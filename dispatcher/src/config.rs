//! The dispatcher's typed configuration, loaded once at start.

use std::net::SocketAddr;

use sha2::{Digest, Sha256};

use fleet_platform::config::{socket_addr, CommonConfig, ConfigError, Source};
use fleet_protocol::secrets::SecretsKey;

use crate::knowledge_base::catalog::{parse_catalog, CatalogEntry};
use crate::lanes::LaneRate;
use crate::scopes::{parse_token_entry, Grant};

/// One accepted bearer token: its digest and its scopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiToken {
    pub digest: [u8; 32],
    pub grant: Grant,
    /// The tenant the token is bound to (`TOKEN@TENANT`): it creates and sees only that tenant's work.
    pub tenant: Option<String>,
}

#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    pub common: CommonConfig,
    pub http_addr: SocketAddr,
    /// The accepted bearer tokens, as SHA-256 digests (the tokens themselves are not kept), each
    /// with what it may do.
    pub tokens: Vec<ApiToken>,
    pub secrets_key: SecretsKey,
    pub allow_private_callbacks: bool,
    /// Largest request body accepted (413 above it).
    pub max_body_bytes: usize,
    /// `FLEET_ARTIFACT_MAX_BYTES`: the largest file an artifact upload takes (413 above it).
    pub artifact_max_bytes: usize,
    /// How often queue depths and the oldest job's age are refreshed for `/metrics`.
    pub stats_interval: std::time::Duration,
    /// `FLEET_SECRET_ROTATION_GRACE`: how long a secret replaced with `rotate_secret` is kept
    /// (and, under Standard Webhooks, still signs).
    pub secret_rotation_grace: std::time::Duration,
    /// `FLEET_CONSOLE_GRAFANA_URL`: the dashboard the console's overview links to, if any.
    pub console_grafana_url: Option<String>,
    /// `FLEET_LIGHT_LANE_RATE` (new turns a second, default 2; 0 turns the lane off) and
    /// `FLEET_LIGHT_LANE_BURST` (default 20): a tenant within them is not flooding the fleet and its
    /// new turns take the light lane.
    pub light_lane_turns: LaneRate,
    /// `FLEET_LIGHT_LANE_CALL_RATE` (new tool calls a second, default 50; 0 turns the lane off) and
    /// `FLEET_LIGHT_LANE_CALL_BURST` (default 200): the same for tool calls.
    pub light_lane_tool_calls: LaneRate,
    /// `FLEET_FLOODING_TENANT_SUBMISSIONS` (default 4; 0: no limit): how many submissions of a
    /// tenant flooding the fleet (over its light-lane allowance) this dispatcher takes in at once.
    pub flooding_tenant_submissions: usize,
    /// `FLEET_MCP_DISCOVERY_INTERVAL` (seconds, default 300): how often every registered MCP
    /// server's tools are discovered again.
    pub mcp_discovery_interval: std::time::Duration,
    /// `FLEET_SERVICES_CATALOG`: the operator's services catalog (a JSON file), read and checked
    /// once; empty when the setting is not set.
    pub services_catalog: Vec<CatalogEntry>,
}

impl DispatcherConfig {
    pub fn load(src: &Source) -> Result<Self, ConfigError> {
        let tokens =
            api_tokens(src.required("FLEET_API_TOKENS")?).map_err(|why| ConfigError::new("FLEET_API_TOKENS", why))?;
        Ok(DispatcherConfig {
            common: CommonConfig::load(src)?,
            http_addr: socket_addr(src, "FLEET_HTTP_ADDR", "127.0.0.1:8080")?,
            tokens,
            secrets_key: fleet_platform::config::secrets_key(src)?,
            allow_private_callbacks: src.flag("FLEET_ALLOW_PRIVATE_CALLBACKS", false)?,
            max_body_bytes: src.parse("FLEET_MAX_BODY_BYTES", 1024 * 1024)?,
            artifact_max_bytes: src.parse("FLEET_ARTIFACT_MAX_BYTES", fleet_protocol::artifacts::DEFAULT_MAX_BYTES)?,
            stats_interval: src.seconds("FLEET_STATS_INTERVAL", std::time::Duration::from_secs(5))?,
            secret_rotation_grace: src
                .seconds("FLEET_SECRET_ROTATION_GRACE", std::time::Duration::from_secs(86_400))?,
            console_grafana_url: src.get("FLEET_CONSOLE_GRAFANA_URL").map(str::to_string).filter(|u| !u.is_empty()),
            light_lane_turns: LaneRate {
                rate: lane_rate(src, "FLEET_LIGHT_LANE_RATE", 2.0)?,
                burst: src.parse("FLEET_LIGHT_LANE_BURST", 20)?,
            },
            light_lane_tool_calls: LaneRate {
                rate: lane_rate(src, "FLEET_LIGHT_LANE_CALL_RATE", 50.0)?,
                burst: src.parse("FLEET_LIGHT_LANE_CALL_BURST", 200)?,
            },
            flooding_tenant_submissions: src.parse("FLEET_FLOODING_TENANT_SUBMISSIONS", 4)?,
            mcp_discovery_interval: src
                .seconds("FLEET_MCP_DISCOVERY_INTERVAL", std::time::Duration::from_secs(300))?
                .max(std::time::Duration::from_secs(1)),
            services_catalog: services_catalog(src)?,
        })
    }
}

/// `FLEET_API_TOKENS`: comma-separated entries, each `TOKEN` (full rights) or
/// `TOKEN:SCOPE+SCOPE...` (only those scopes), the token optionally bound to a tenant as
/// `TOKEN@TENANT` (`@` is not a bearer token's character, so the first `@` starts the tenant).
fn api_tokens(raw: &str) -> Result<Vec<ApiToken>, String> {
    let mut tokens = Vec::new();
    for entry in raw.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (token, grant) = parse_token_entry(entry)?;
        let (token, tenant) = match token.split_once('@') {
            Some((token, tenant)) if fleet_protocol::tenant::is_tenant_name(tenant) => {
                (token, Some(tenant.to_string()))
            }
            Some((_, tenant)) => return Err(format!("{tenant:?} is not a tenant name (1-64 of A-Z a-z 0-9 . _ -)")),
            None => (token, None),
        };
        if token.len() < 16 {
            return Err("every token must be at least 16 characters".into());
        }
        tokens.push(ApiToken { digest: Sha256::digest(token.as_bytes()).into(), grant, tenant });
    }
    if tokens.is_empty() {
        return Err("must list at least one token".into());
    }
    Ok(tokens)
}

/// `FLEET_SERVICES_CATALOG`: the file's entries. A file that cannot be read, is malformed, holds
/// an id twice or a field named like a secret stops the dispatcher, naming the file and the entry.
fn services_catalog(src: &Source) -> Result<Vec<CatalogEntry>, ConfigError> {
    const SETTING: &str = "FLEET_SERVICES_CATALOG";
    let Some(path) = src.get(SETTING) else { return Ok(vec![]) };
    let text =
        std::fs::read_to_string(path).map_err(|e| ConfigError::new(SETTING, format!("{path}: cannot be read: {e}")))?;
    parse_catalog(&text).map_err(|e| ConfigError::new(SETTING, format!("{path}: {e}")))
}

/// A light lane's rate (`FLEET_LIGHT_LANE_RATE`, `FLEET_LIGHT_LANE_CALL_RATE`): a finite number
/// of jobs a second, at least 0.
fn lane_rate(src: &Source, setting: &'static str, default: f64) -> Result<f64, ConfigError> {
    let rate: f64 = src.parse(setting, default)?;
    if !rate.is_finite() || rate < 0.0 {
        return Err(ConfigError::new(setting, "must be a number of jobs a second, 0 or more"));
    }
    Ok(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn tokens_are_required_and_kept_only_as_digests() {
        let e = DispatcherConfig::load(&Source::from_pairs([("FLEET_SECRETS_KEY", KEY)])).unwrap_err();
        assert_eq!(e.setting, "FLEET_API_TOKENS");
        let e =
            DispatcherConfig::load(&Source::from_pairs([("FLEET_SECRETS_KEY", KEY), ("FLEET_API_TOKENS", "short")]))
                .unwrap_err();
        assert_eq!(e.setting, "FLEET_API_TOKENS");
        let c = DispatcherConfig::load(&Source::from_pairs([
            ("FLEET_SECRETS_KEY", KEY),
            ("FLEET_API_TOKENS", "token-one-0123456789, token-two-0123456789"),
        ]))
        .unwrap();
        assert_eq!(c.tokens.len(), 2);
        assert!(c.tokens.iter().all(|t| t.grant == Grant::Full), "plain tokens keep full rights");
        assert!(!format!("{c:?}").contains("token-one"));
        assert!(!c.allow_private_callbacks);
        assert_eq!(c.http_addr.to_string(), "127.0.0.1:8080");
    }

    #[test]
    fn a_bad_services_catalog_stops_the_dispatcher_naming_the_file_and_the_entry() {
        let dir = std::env::temp_dir().join(format!("fleet-catalog-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("services.json");
        let twice = r#"[{"id": "a", "name": "A", "auth_type": "none"}, {"id": "a", "name": "B", "auth_type": "none"}]"#;
        std::fs::write(&file, twice).unwrap();
        let path = file.to_str().unwrap();
        let load = |path: &str| {
            DispatcherConfig::load(&Source::from_pairs([
                ("FLEET_SECRETS_KEY", KEY),
                ("FLEET_API_TOKENS", "token-one-0123456789"),
                ("FLEET_SERVICES_CATALOG", path),
            ]))
        };
        let e = load(path).unwrap_err();
        assert_eq!(e.setting, "FLEET_SERVICES_CATALOG");
        assert!(e.problem.starts_with(path) && e.problem.contains("entry [1] (id \"a\")"), "{}", e.problem);
        let e = load("/nonexistent/services.json").unwrap_err();
        assert!(e.problem.starts_with("/nonexistent/services.json: cannot be read"), "{}", e.problem);
        std::fs::write(&file, r#"[{"id": "a", "name": "A", "auth_type": "none"}]"#).unwrap();
        assert_eq!(load(path).unwrap().services_catalog.len(), 1);
        assert!(load("").unwrap().services_catalog.is_empty(), "unset or empty: no catalog");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_bad_address_names_its_setting() {
        let e = DispatcherConfig::load(&Source::from_pairs([
            ("FLEET_SECRETS_KEY", KEY),
            ("FLEET_API_TOKENS", "token-one-0123456789"),
            ("FLEET_HTTP_ADDR", "localhost"),
        ]))
        .unwrap_err();
        assert_eq!(e.setting, "FLEET_HTTP_ADDR");
    }

    #[test]
    fn a_token_may_carry_scopes_and_a_bad_one_names_the_setting() {
        let tokens = api_tokens("full-token-0123456789, ci-token-0123456789:tools:read+executions:read").unwrap();
        assert_eq!(tokens[0].grant, Grant::Full);
        assert!(tokens[1].grant.allows(crate::scopes::Scope::ExecutionsRead));
        assert!(!tokens[1].grant.allows(crate::scopes::Scope::ToolsWrite));
        assert_eq!(tokens[1].digest, <[u8; 32]>::from(Sha256::digest(b"ci-token-0123456789")));
        let e = DispatcherConfig::load(&Source::from_pairs([
            ("FLEET_SECRETS_KEY", KEY),
            ("FLEET_API_TOKENS", "ci-token-0123456789:tools:typo"),
        ]))
        .unwrap_err();
        assert_eq!(e.setting, "FLEET_API_TOKENS");
        assert!(api_tokens("short:tools:read").is_err());
        assert!(api_tokens("short@acme").is_err());
    }

    #[test]
    fn a_token_may_be_bound_to_a_tenant_with_or_without_scopes() {
        let tokens =
            api_tokens("plain-token-0123456789, a-token-0123456789@acme, b-token-0123456789@beta:turns:write").unwrap();
        assert_eq!(tokens[0].tenant, None);
        assert_eq!((tokens[1].tenant.as_deref(), tokens[1].grant), (Some("acme"), Grant::Full));
        assert_eq!(tokens[1].digest, <[u8; 32]>::from(Sha256::digest(b"a-token-0123456789")));
        assert_eq!(tokens[2].tenant.as_deref(), Some("beta"));
        assert!(tokens[2].grant.allows(crate::scopes::Scope::TurnsWrite));
        assert!(!tokens[2].grant.allows(crate::scopes::Scope::ToolsRead));
        assert!(api_tokens("a-token-0123456789@bad|name").is_err());
        assert!(api_tokens("a-token-0123456789@").is_err());
    }
}
