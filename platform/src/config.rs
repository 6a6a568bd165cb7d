//! Typed configuration from the environment (and an optional `FLEET_CONFIG_FILE` of `KEY=VALUE`
//! lines that the environment overrides), loaded once at start. A bad or missing setting is an
//! error that names the setting.

use std::time::Duration;

use fleet_protocol::dead_letters::Retention;
use fleet_protocol::keys::Keys;
use fleet_protocol::retry::RetryPolicy;
use fleet_protocol::secrets::SecretsKey;
use fleet_protocol::topology::Topology;

use crate::source::parse_seconds;
pub use crate::source::{ConfigError, Source};

/// The default retention of the executions index: as long as a record lives, a million entries.
pub fn default_index_retention() -> Retention {
    Retention { max_age_ms: fleet_protocol::IDEMPOTENCY_TTL_SECS as i64 * 1000, max_count: 1_000_000 }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Settings every fleet process shares.
#[derive(Debug, Clone)]
pub struct CommonConfig {
    /// Broker endpoints in order of preference (`FLEET_AMQP_URL` may list cluster nodes, comma-separated).
    pub amqp_urls: Vec<String>,
    pub redis_url: String,
    pub topology: Topology,
    pub keys: Keys,
    pub retry: RetryPolicy,
    pub log_format: LogFormat,
    /// Bound on one Redis command, and on connecting to Redis.
    pub redis_timeout: Duration,
    /// Bound on one publish and its broker confirm.
    pub publish_timeout: Duration,
    /// How long and how many dead letters Redis keeps.
    pub dead_letter_retention: Retention,
    /// How long and how many entries the executions index keeps.
    pub execution_index_retention: Retention,
    /// Trusted roots and client certificate for `rediss://`, `amqps://` and HTTPS.
    pub tls: crate::tls::ClientTls,
    /// The model providers a turn may name, and the defaults of a turn's `model_config`: the
    /// dispatcher refuses an unknown provider, the worker calls the named one.
    pub llm: LlmRouting,
    /// `FLEET_ARTIFACTS_URL`: where seed 001's uploaded files are kept (the dispatcher stores and
    /// deletes them, the worker reads images for the model).
    pub artifacts: crate::artifacts::ArtifactStore,
}

/// `FLEET_ARTIFACTS_URL`'s default: a directory on the host (a chart sets an `s3://` bucket).
pub const DEFAULT_ARTIFACTS_URL: &str = "file:///var/lib/fleet/artifacts";

impl CommonConfig {
    pub fn load(src: &Source) -> Result<Self, ConfigError> {
        let amqp_urls: Vec<String> = src
            .string("FLEET_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
            .split(',')
            .map(|u| u.trim().to_string())
            .filter(|u| !u.is_empty())
            .collect();
        if amqp_urls.is_empty() || amqp_urls.iter().any(|u| !u.starts_with("amqp://") && !u.starts_with("amqps://")) {
            return Err(ConfigError::new("FLEET_AMQP_URL", "every endpoint must start with amqp:// or amqps://"));
        }
        let redis_url = src.string("FLEET_REDIS_URL", "redis://127.0.0.1:6379/0");
        // Several comma-separated nodes name a Redis Cluster.
        let nodes: Vec<&str> = redis_url.split(',').map(str::trim).collect();
        if nodes.iter().any(|node| redis::Client::open(*node).is_err()) {
            return Err(ConfigError::new(
                "FLEET_REDIS_URL",
                "is not a valid redis:// or rediss:// URL (or comma-separated cluster nodes)",
            ));
        }
        if nodes.iter().any(|n| n.starts_with("rediss://")) && !nodes.iter().all(|n| n.starts_with("rediss://")) {
            return Err(ConfigError::new("FLEET_REDIS_URL", "cluster nodes must all be rediss:// or all redis://"));
        }
        let prefix = src.string("FLEET_TOPOLOGY_PREFIX", "fleet");
        if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
            return Err(ConfigError::new("FLEET_TOPOLOGY_PREFIX", "may hold only letters, digits, '.', '_' and '-'"));
        }
        let retry = match src.get("FLEET_RETRY_DELAYS") {
            None => RetryPolicy::default(),
            Some(raw) => {
                let delays = raw
                    .split(',')
                    .map(|s| parse_seconds(s.trim()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|p| ConfigError::new("FLEET_RETRY_DELAYS", p))?;
                RetryPolicy::new(delays).map_err(|p| ConfigError::new("FLEET_RETRY_DELAYS", p))?
            }
        };
        let log_format = match src.string("FLEET_LOG_FORMAT", "text").as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => return Err(ConfigError::new("FLEET_LOG_FORMAT", format!("must be text or json, got {other:?}"))),
        };
        let tls = crate::tls::ClientTls::load(src)?;
        Ok(CommonConfig {
            amqp_urls,
            redis_url,
            topology: Topology::new(prefix, retry.delays().to_vec()),
            keys: key_prefix(src)?,
            retry,
            log_format,
            redis_timeout: src.seconds("FLEET_REDIS_TIMEOUT", Duration::from_secs(2))?,
            publish_timeout: src.seconds("FLEET_PUBLISH_TIMEOUT", Duration::from_secs(5))?,
            dead_letter_retention: retention(
                src,
                "FLEET_DEAD_LETTER_RETENTION",
                "FLEET_DEAD_LETTER_MAX",
                Retention::default(),
            )?,
            execution_index_retention: retention(
                src,
                "FLEET_EXECUTION_INDEX_RETENTION",
                "FLEET_EXECUTION_INDEX_MAX",
                default_index_retention(),
            )?,
            artifacts: crate::artifacts::ArtifactStore::open(
                &src.string("FLEET_ARTIFACTS_URL", DEFAULT_ARTIFACTS_URL),
                src,
                &tls,
            )?,
            tls,
            llm: LlmRouting::load(src)?,
        })
    }
}

/// A provider of `FLEET_LLM_PROVIDERS`: where it is, which setting holds its key (the key itself
/// is read by the worker only, and never travels in a turn's state or an AMQP message), and the
/// provider tried next when it fails with a retryable error.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSpec {
    pub base_url: String,
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub fallback: Option<String>,
    /// Its fleet-wide budget (requests and tokens per minute, optionally per model).
    #[serde(default)]
    pub budget: Option<fleet_protocol::budget::Budget>,
}

/// Which providers and model a turn may use, and what it gets when its `model_config` is silent.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmRouting {
    /// The name of the provider at `FLEET_LLM_BASE_URL` (`FLEET_LLM_DEFAULT_PROVIDER`, default
    /// `openai` as in the seed): used when a turn names none.
    pub default_provider: String,
    /// `FLEET_LLM_DEFAULT_MODEL` (default `gpt-4o`, the seed's).
    pub default_model: String,
    /// The further providers of `FLEET_LLM_PROVIDERS`, by name.
    pub providers: std::collections::BTreeMap<String, ProviderSpec>,
    /// The default provider's fallback (`FLEET_LLM_FALLBACK_PROVIDER`).
    pub default_fallback: Option<String>,
    /// The default provider's budget (`FLEET_LLM_BUDGET`, the same object as a provider's `budget`).
    pub default_budget: Option<fleet_protocol::budget::Budget>,
}

impl LlmRouting {
    pub fn load(src: &Source) -> Result<Self, ConfigError> {
        let default_provider = src.string("FLEET_LLM_DEFAULT_PROVIDER", "openai");
        if !is_provider_name(&default_provider) {
            return Err(ConfigError::new("FLEET_LLM_DEFAULT_PROVIDER", PROVIDER_NAME_RULE));
        }
        let default_model = src.string("FLEET_LLM_DEFAULT_MODEL", "gpt-4o");
        if default_model.len() > 256 || default_model.chars().any(char::is_control) {
            return Err(ConfigError::new(
                "FLEET_LLM_DEFAULT_MODEL",
                "must be 1-256 characters without control characters",
            ));
        }
        let providers = match src.get("FLEET_LLM_PROVIDERS") {
            None => Default::default(),
            Some(raw) => parse_providers(raw, &default_provider)
                .map_err(|problem| ConfigError::new("FLEET_LLM_PROVIDERS", problem))?,
        };
        let routing = LlmRouting {
            default_provider,
            default_model,
            providers,
            default_fallback: src.get("FLEET_LLM_FALLBACK_PROVIDER").map(str::to_string),
            default_budget: match src.get("FLEET_LLM_BUDGET") {
                None => None,
                Some(raw) => Some(parse_budget(raw).map_err(|p| ConfigError::new("FLEET_LLM_BUDGET", p))?),
            },
        };
        if let Some(name) = &routing.default_fallback {
            if !routing.knows(name) || *name == routing.default_provider {
                return Err(ConfigError::new("FLEET_LLM_FALLBACK_PROVIDER", "must name another configured provider"));
            }
        }
        Ok(routing)
    }

    /// Whether a turn may name `provider`.
    pub fn knows(&self, provider: &str) -> bool {
        provider == self.default_provider || self.providers.contains_key(provider)
    }

    /// Every provider name, the default first.
    pub fn names(&self) -> Vec<&str> {
        std::iter::once(self.default_provider.as_str()).chain(self.providers.keys().map(String::as_str)).collect()
    }

    /// `provider`'s budget, if it has one that limits anything.
    pub fn budget_of(&self, provider: &str) -> Option<&fleet_protocol::budget::Budget> {
        let budget = if provider == self.default_provider {
            self.default_budget.as_ref()
        } else {
            self.providers.get(provider)?.budget.as_ref()
        };
        budget.filter(|b| !b.is_none())
    }

    /// The provider tried after `provider` fails with a retryable error, if any.
    pub fn fallback_of(&self, provider: &str) -> Option<&str> {
        if provider == self.default_provider {
            return self.default_fallback.as_deref();
        }
        self.providers.get(provider)?.fallback.as_deref()
    }
}

const PROVIDER_NAME_RULE: &str = "a provider name is 1-64 letters, digits, '.', '_' or '-'";

fn is_provider_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// A budget's JSON: `{"requests_per_minute": n, "tokens_per_minute": n, "burst_seconds": n, "models": {…}}`.
fn parse_budget(raw: &str) -> Result<fleet_protocol::budget::Budget, String> {
    let budget: fleet_protocol::budget::Budget =
        serde_json::from_str(raw).map_err(|e| format!("must be a JSON budget object: {e}"))?;
    budget.check()?;
    Ok(budget)
}

/// `FLEET_LLM_PROVIDERS`: `{"name": {"base_url": "https://…/v1", "api_key_env": "SETTING", "fallback": "other"}}`.
fn parse_providers(
    raw: &str,
    default_provider: &str,
) -> Result<std::collections::BTreeMap<String, ProviderSpec>, String> {
    let providers: std::collections::BTreeMap<String, ProviderSpec> =
        serde_json::from_str(raw).map_err(|e| format!("must be a JSON object of providers: {e}"))?;
    for (name, spec) in &providers {
        if !is_provider_name(name) {
            return Err(format!("{name:?}: {PROVIDER_NAME_RULE}"));
        }
        if name == default_provider {
            return Err(format!("{name:?} is the default provider's name (FLEET_LLM_BASE_URL)"));
        }
        if !spec.base_url.starts_with("http://") && !spec.base_url.starts_with("https://") {
            return Err(format!("{name}.base_url must be an http(s) URL"));
        }
        if let Some(budget) = &spec.budget {
            budget.check().map_err(|p| format!("{name}.budget: {p}"))?;
        }
        if let Some(fallback) = &spec.fallback {
            if fallback == name || (fallback != default_provider && !providers.contains_key(fallback)) {
                return Err(format!("{name}.fallback must name another configured provider"));
            }
        }
    }
    Ok(providers)
}

/// `FLEET_REDIS_KEY_PREFIX` (default `fleet:`): namespaces every key, so the fleet's claims never
/// meet a tool owner's own `idempotency:` keys in a shared Redis. A fleet upgraded from a release
/// whose default was empty sets it to `""` to keep its data. Braces would cut an execution's hash
/// tag (`keys.rs`), and a control character has no place in a key.
fn key_prefix(src: &Source) -> Result<Keys, ConfigError> {
    // Set but empty is meant: the keys of a fleet from before the prefix had a default.
    let prefix = src.raw("FLEET_REDIS_KEY_PREFIX").map_or(DEFAULT_KEY_PREFIX, str::trim);
    if prefix.len() > 64 || prefix.contains(['{', '}']) || prefix.chars().any(char::is_control) {
        return Err(ConfigError::new(
            "FLEET_REDIS_KEY_PREFIX",
            "must be at most 64 characters, without braces or control characters",
        ));
    }
    Ok(Keys::new(prefix))
}

/// The key prefix when none is configured.
pub const DEFAULT_KEY_PREFIX: &str = "fleet:";

/// A retention from its two variables: `age_var` (seconds, at least 1) and `max_var` (entries, at
/// least 1), each `default`'s when unset. `FLEET_DEAD_LETTER_RETENTION` (default 30 days) and
/// `FLEET_DEAD_LETTER_MAX` (default 100,000); `FLEET_EXECUTION_INDEX_RETENTION` (default 7 days)
/// and `FLEET_EXECUTION_INDEX_MAX` (entries per set, default 1,000,000).
fn retention(src: &Source, age_var: &str, max_var: &str, default: Retention) -> Result<Retention, ConfigError> {
    let age = src.seconds(age_var, Duration::from_millis(default.max_age_ms as u64))?;
    if age < Duration::from_secs(1) {
        return Err(ConfigError::new(age_var, "must be at least 1 second"));
    }
    let max_count: u64 = src.parse(max_var, default.max_count)?;
    if max_count == 0 {
        return Err(ConfigError::new(max_var, "must be at least 1"));
    }
    Ok(Retention { max_age_ms: age.as_millis() as i64, max_count })
}

/// `FLEET_SECRETS_KEY`: required by every process that stores or uses a secret.
pub fn secrets_key(src: &Source) -> Result<SecretsKey, ConfigError> {
    SecretsKey::parse(src.required("FLEET_SECRETS_KEY")?)
        .map_err(|e| ConfigError::new("FLEET_SECRETS_KEY", e.to_string()))
}

/// An HTTP listen address setting.
pub fn socket_addr(src: &Source, name: &str, default: &str) -> Result<std::net::SocketAddr, ConfigError> {
    src.parse(name, default.parse().expect("default addresses parse"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_specs() {
        let c = CommonConfig::load(&Source::default()).unwrap();
        assert_eq!(c.amqp_urls, ["amqp://guest:guest@127.0.0.1:5672/%2f"]);
        let two = CommonConfig::load(&Source::from_pairs([("FLEET_AMQP_URL", "amqp://a:5672/%2f, amqp://b:5672/%2f")]))
            .unwrap();
        assert_eq!(two.amqp_urls, ["amqp://a:5672/%2f", "amqp://b:5672/%2f"]);
        assert_eq!(c.redis_url, "redis://127.0.0.1:6379/0");
        let tls = CommonConfig::load(&Source::from_pairs([("FLEET_REDIS_URL", "rediss://r.example:6380/0")])).unwrap();
        assert_eq!(tls.redis_url, "rediss://r.example:6380/0");
        assert_eq!(c.retry.max_attempts(), 6);
        assert_eq!(c.topology.jobs_exchange(), "fleet.jobs");
        assert_eq!(c.dead_letter_retention, Retention { max_age_ms: 30 * 86_400_000, max_count: 100_000 });
    }

    #[test]
    fn errors_name_the_setting() {
        let bad = |k, v| CommonConfig::load(&Source::from_pairs([(k, v)])).unwrap_err().setting;
        assert_eq!(bad("FLEET_AMQP_URL", "http://x"), "FLEET_AMQP_URL");
        assert_eq!(bad("FLEET_REDIS_URL", "nope"), "FLEET_REDIS_URL");
        assert_eq!(bad("FLEET_REDIS_URL", "redis://a:7000,nope"), "FLEET_REDIS_URL");
        assert_eq!(bad("FLEET_REDIS_URL", "rediss://a:7000,redis://b:7001"), "FLEET_REDIS_URL");
        assert_eq!(bad("FLEET_TLS_CA_FILE", "/nonexistent/ca.pem"), "FLEET_TLS_CA_FILE");
        assert_eq!(bad("FLEET_RETRY_DELAYS", "1,x"), "FLEET_RETRY_DELAYS");
        assert_eq!(bad("FLEET_RETRY_DELAYS", "2,1"), "FLEET_RETRY_DELAYS");
        assert_eq!(bad("FLEET_LOG_FORMAT", "xml"), "FLEET_LOG_FORMAT");
        assert_eq!(bad("FLEET_TOPOLOGY_PREFIX", "a b"), "FLEET_TOPOLOGY_PREFIX");
        assert_eq!(bad("FLEET_DEAD_LETTER_RETENTION", "0"), "FLEET_DEAD_LETTER_RETENTION");
        assert_eq!(bad("FLEET_DEAD_LETTER_MAX", "0"), "FLEET_DEAD_LETTER_MAX");
        assert_eq!(bad("FLEET_DEAD_LETTER_MAX", "many"), "FLEET_DEAD_LETTER_MAX");
        let e = secrets_key(&Source::default()).unwrap_err();
        assert_eq!(e.to_string(), "configuration error: FLEET_SECRETS_KEY: is required but not set");
    }

    #[test]
    fn providers_are_named_and_checked() {
        let routing = LlmRouting::load(&Source::default()).unwrap();
        assert_eq!((routing.default_provider.as_str(), routing.default_model.as_str()), ("openai", "gpt-4o"));
        assert_eq!(routing.names(), ["openai"]);
        let raw = r#"{"b": {"base_url": "http://127.0.0.1:1/v1", "api_key_env": "B_KEY", "fallback": "openai"}}"#;
        let routing = LlmRouting::load(&Source::from_pairs([
            ("FLEET_LLM_PROVIDERS", raw),
            ("FLEET_LLM_DEFAULT_PROVIDER", "a"),
            ("FLEET_LLM_FALLBACK_PROVIDER", "b"),
        ]))
        .unwrap_err();
        assert_eq!(routing.setting, "FLEET_LLM_PROVIDERS", "b's fallback names no provider");
        let routing =
            LlmRouting::load(&Source::from_pairs([("FLEET_LLM_PROVIDERS", raw), ("FLEET_LLM_FALLBACK_PROVIDER", "b")]))
                .unwrap();
        assert!(routing.knows("b") && routing.knows("openai") && !routing.knows("c"));
        assert_eq!((routing.fallback_of("openai"), routing.fallback_of("b")), (Some("b"), Some("openai")));
        assert_eq!(routing.providers["b"].api_key_env.as_deref(), Some("B_KEY"));
        let bad = |raw| LlmRouting::load(&Source::from_pairs([("FLEET_LLM_PROVIDERS", raw)])).unwrap_err().setting;
        assert_eq!(bad("[]"), "FLEET_LLM_PROVIDERS");
        assert_eq!(bad(r#"{"openai": {"base_url": "http://x"}}"#), "FLEET_LLM_PROVIDERS");
        assert_eq!(bad(r#"{"b": {"base_url": "ftp://x"}}"#), "FLEET_LLM_PROVIDERS");
        assert_eq!(bad(r#"{"b c": {"base_url": "http://x"}}"#), "FLEET_LLM_PROVIDERS");
        assert_eq!(bad(r#"{"b": {"base_url": "http://x", "api_key": "sk-inline"}}"#), "FLEET_LLM_PROVIDERS");
        let fallback = LlmRouting::load(&Source::from_pairs([("FLEET_LLM_FALLBACK_PROVIDER", "nope")]));
        assert_eq!(fallback.unwrap_err().setting, "FLEET_LLM_FALLBACK_PROVIDER");
    }

    #[test]
    fn budgets_come_with_the_provider_table() {
        let raw = r#"{"b": {"base_url": "http://x/v1", "budget": {"requests_per_minute": 600, "models": {"m": {"tokens_per_minute": 9000}}}}}"#;
        let routing = LlmRouting::load(&Source::from_pairs([
            ("FLEET_LLM_PROVIDERS", raw),
            ("FLEET_LLM_BUDGET", r#"{"tokens_per_minute": 200000}"#),
        ]))
        .unwrap();
        assert_eq!(routing.budget_of("b").unwrap().requests_per_minute, Some(600));
        assert_eq!(routing.budget_of("openai").unwrap().tokens_per_minute, Some(200_000));
        assert!(routing.budget_of("nope").is_none());
        let bad = |k, v| LlmRouting::load(&Source::from_pairs([(k, v)])).unwrap_err();
        let e = bad("FLEET_LLM_PROVIDERS", r#"{"b": {"base_url": "http://x", "budget": {"requests_per_minute": 0}}}"#);
        assert!(e.to_string().contains("b.budget: requests_per_minute must be at least 1"), "{e}");
        assert_eq!(bad("FLEET_LLM_BUDGET", r#"{"rpm": 5}"#).setting, "FLEET_LLM_BUDGET");
    }

    #[test]
    fn fractional_delays_for_fast_tests() {
        let c = CommonConfig::load(&Source::from_pairs([("FLEET_RETRY_DELAYS", "0.1, 0.2")])).unwrap();
        assert_eq!(c.retry.delays(), [Duration::from_millis(100), Duration::from_millis(200)]);
    }

    #[test]
    fn env_files_are_key_value_lines() {
        let pairs = crate::source::parse_env_file("# comment\nFLEET_A=1\n\nFLEET_B = \"two\"\n");
        assert_eq!(pairs, vec![("FLEET_A".into(), "1".into()), ("FLEET_B".into(), "two".into())]);
    }
}
