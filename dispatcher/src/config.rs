//! The dispatcher's typed configuration, loaded once at start.

use std::net::SocketAddr;

use sha2::{Digest, Sha256};

use fleet_platform::config::{socket_addr, CommonConfig, ConfigError, Source};
use fleet_protocol::secrets::SecretsKey;

#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    pub common: CommonConfig,
    pub http_addr: SocketAddr,
    /// SHA-256 digests of the accepted bearer tokens (the tokens themselves are not kept).
    pub token_digests: Vec<[u8; 32]>,
    pub secrets_key: SecretsKey,
    pub allow_private_callbacks: bool,
    /// Largest request body accepted (413 above it).
    pub max_body_bytes: usize,
    /// How often queue depths and the oldest job's age are refreshed for `/metrics`.
    pub stats_interval: std::time::Duration,
}

impl DispatcherConfig {
    pub fn load(src: &Source) -> Result<Self, ConfigError> {
        let tokens: Vec<&str> =
            src.required("FLEET_API_TOKENS")?.split(',').map(str::trim).filter(|t| !t.is_empty()).collect();
        if tokens.is_empty() {
            return Err(ConfigError::new("FLEET_API_TOKENS", "must list at least one token"));
        }
        if tokens.iter().any(|t| t.len() < 16) {
            return Err(ConfigError::new("FLEET_API_TOKENS", "every token must be at least 16 characters"));
        }
        Ok(DispatcherConfig {
            common: CommonConfig::load(src)?,
            http_addr: socket_addr(src, "FLEET_HTTP_ADDR", "127.0.0.1:8080")?,
            token_digests: tokens.iter().map(|t| Sha256::digest(t.as_bytes()).into()).collect(),
            secrets_key: fleet_platform::config::secrets_key(src)?,
            allow_private_callbacks: src.flag("FLEET_ALLOW_PRIVATE_CALLBACKS", false)?,
            max_body_bytes: src.parse("FLEET_MAX_BODY_BYTES", 1024 * 1024)?,
            stats_interval: src.seconds("FLEET_STATS_INTERVAL", std::time::Duration::from_secs(5))?,
        })
    }
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
        assert_eq!(c.token_digests.len(), 2);
        assert!(!format!("{c:?}").contains("token-one"));
        assert!(!c.allow_private_callbacks);
        assert_eq!(c.http_addr.to_string(), "127.0.0.1:8080");
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
}
