//! The worker's typed configuration, loaded once at start.

use std::net::SocketAddr;
use std::time::Duration;

use fleet_platform::config::{socket_addr, CommonConfig, ConfigError, Source};
use fleet_protocol::callback::{ASYNC_POLL_LIMIT_SECS, TOOL_CALLBACK_TIMEOUT_SECS};
use fleet_protocol::redact::Redactor;
use fleet_protocol::secrets::SecretsKey;
use fleet_protocol::tenant;

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub common: CommonConfig,
    pub http_addr: SocketAddr,
    /// Jobs held at once (also the AMQP prefetch).
    pub concurrency: u16,
    pub secrets_key: SecretsKey,
    /// Every secret this process was configured with (`configured_secrets`), redacted from what
    /// model providers and tool owners answer before the fleet keeps any of it.
    pub redactor: std::sync::Arc<Redactor>,
    pub allow_private_callbacks: bool,
    /// The private networks a data source may be on (`FLEET_DATA_SOURCE_NETWORKS`; all of them
    /// with `FLEET_ALLOW_PRIVATE_CALLBACKS`).
    pub data_source_networks: fleet_platform::data_sources::PrivateNetworks,
    /// Lease on an idempotency claim; renewed every third of it while the attempt runs.
    pub claim_lease: Duration,
    pub callback_timeout: Duration,
    pub async_poll_interval: Duration,
    pub async_poll_limit: Duration,
    /// How long SIGTERM waits for held jobs before returning them to the queue.
    pub shutdown_grace: Duration,
    /// Liveness fails after this long without consumers while jobs wait.
    pub liveness_grace: Duration,
    /// Every OpenAI-compatible endpoint (`…/v1`) a turn may name, with its key: the default
    /// (`FLEET_LLM_BASE_URL`, `FLEET_LLM_API_KEY`) first, then `FLEET_LLM_PROVIDERS`'. And the
    /// per-call timeout.
    pub llm_providers: Vec<ProviderEndpoint>,
    pub llm_timeout: Duration,
    /// `max_tokens` sent when the assistant's `model_config` names none.
    pub llm_max_tokens: u32,
    /// The most bytes of one model response a worker holds before failing the attempt.
    pub llm_max_response_bytes: usize,
    /// The models the fleet is configured with (`FLEET_LLM_DEFAULT_MODEL` and `FLEET_LLM_MODELS`):
    /// the `model` label's values, any other model counting as `other`.
    pub llm_models: Vec<String>,
    /// `FLEET_LLM_CONTEXT_WINDOWS`: each listed model's context window (tokens), for assistants
    /// whose `model_config` names none; a prompt estimated over it ends the turn before its call.
    pub llm_context_windows: std::collections::BTreeMap<String, u32>,
    /// Model rounds a turn may take.
    pub max_rounds: u32,
    /// `FLEET_TENANT_DAILY_TOKENS`: tokens (prompt and completion) each listed tenant may use per
    /// UTC day; a turn over its tenant's cap ends with `budget_exceeded` before its model call.
    pub tenant_daily_tokens: std::collections::BTreeMap<String, u64>,
    /// `FLEET_TENANT_WEIGHTS`: each listed tenant's share of a provider's budget when tenants
    /// wait for it together (default 1).
    pub tenant_weights: std::collections::BTreeMap<String, u32>,
    /// `FLEET_TENANT_MAX_CONCURRENT_TURNS`: the most turns of each listed tenant running a step at
    /// once, fleet-wide; more are parked until a slot frees.
    pub tenant_max_turns: std::collections::BTreeMap<String, u32>,
    /// The tenants usage metrics name (`FLEET_TENANTS`, the tenants the per-tenant settings list,
    /// and those bound in `FLEET_API_TOKENS` if the worker is given it); any other is `other`.
    pub metric_tenants: std::collections::BTreeSet<String>,
    /// How long a session stays held by its turn without the turn touching it.
    /// Deliveries after which a job is dead-lettered without running (`FLEET_MAX_DELIVERIES`).
    pub max_deliveries: u64,
    /// Largest tool result (its JSON text, bytes) handed to the model whole; above it the model
    /// gets the first bytes and `truncated: true`.
    pub tool_result_max_bytes: usize,
    /// A session's remembered conversation: at most this many messages and bytes (stored JSON);
    /// beyond either, the oldest whole exchanges are dropped.
    pub history_max_messages: usize,
    pub history_max_bytes: usize,
    /// How long a tool or webhook registration is cached by the worker.
    pub registry_cache_ttl: Duration,
    /// Names this worker in claims and logs.
    pub worker_id: String,
    /// Endpoint health: the fleet's circuit policy, which a tool's `circuit_breaker` overrides.
    pub circuit: fleet_protocol::circuit::CircuitPolicy,
}

/// Where a provider is and the key it is called with.
#[derive(Clone, PartialEq)]
pub struct ProviderEndpoint {
    pub name: String,
    /// None for the default provider without `FLEET_LLM_BASE_URL`: its calls fail for good.
    pub base_url: Option<String>,
    pub api_key: Option<String>,
}

impl std::fmt::Debug for ProviderEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is never printed.
        f.debug_struct("ProviderEndpoint").field("name", &self.name).field("base_url", &self.base_url).finish()
    }
}

/// The default provider and those of `FLEET_LLM_PROVIDERS`, each key read from the setting its
/// `api_key_env` names (a named setting that is not set is an error naming it).
fn provider_endpoints(
    src: &Source,
    common: &CommonConfig,
    base_url: Option<String>,
    api_key: Option<String>,
) -> Result<Vec<ProviderEndpoint>, ConfigError> {
    let mut endpoints = vec![ProviderEndpoint { name: common.llm.default_provider.clone(), base_url, api_key }];
    for (name, spec) in &common.llm.providers {
        let api_key = match &spec.api_key_env {
            None => None,
            Some(setting) => Some(src.get(setting).map(str::to_string).ok_or_else(|| {
                ConfigError::new(setting, format!("is named by FLEET_LLM_PROVIDERS ({name}.api_key_env) but not set"))
            })?),
        };
        endpoints.push(ProviderEndpoint { name: name.clone(), base_url: Some(spec.base_url.clone()), api_key });
    }
    Ok(endpoints)
}

impl WorkerConfig {
    pub fn load(src: &Source) -> Result<Self, ConfigError> {
        let concurrency: u16 = src.parse("FLEET_WORKER_CONCURRENCY", 32)?;
        if concurrency == 0 {
            return Err(ConfigError::new("FLEET_WORKER_CONCURRENCY", "must be at least 1"));
        }
        let max_deliveries: u64 = src.parse("FLEET_MAX_DELIVERIES", 10)?;
        if max_deliveries == 0 {
            return Err(ConfigError::new("FLEET_MAX_DELIVERIES", "must be at least 1"));
        }
        let claim_lease = src.seconds("FLEET_CLAIM_LEASE", Duration::from_secs(60))?;
        if claim_lease < Duration::from_millis(300) {
            return Err(ConfigError::new("FLEET_CLAIM_LEASE", "must be at least 0.3 seconds"));
        }
        let tool_result_max_bytes: usize = src.parse("FLEET_TOOL_RESULT_MAX_BYTES", 64 * 1024)?;
        if tool_result_max_bytes < 64 {
            return Err(ConfigError::new("FLEET_TOOL_RESULT_MAX_BYTES", "must be at least 64"));
        }
        let history_max_messages: usize =
            src.parse("FLEET_SESSION_HISTORY_MAX_MESSAGES", fleet_protocol::history::DEFAULT_MAX_MESSAGES)?;
        if history_max_messages == 0 {
            return Err(ConfigError::new("FLEET_SESSION_HISTORY_MAX_MESSAGES", "must be at least 1"));
        }
        let history_max_bytes: usize =
            src.parse("FLEET_SESSION_HISTORY_MAX_BYTES", fleet_protocol::history::DEFAULT_MAX_BYTES)?;
        if history_max_bytes < 1024 {
            return Err(ConfigError::new("FLEET_SESSION_HISTORY_MAX_BYTES", "must be at least 1024"));
        }
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".into());
        let common = CommonConfig::load(src)?;
        let llm_models = configured_models(src, &common.llm.default_model)?;
        let llm_base_url = match src.get("FLEET_LLM_BASE_URL") {
            Some(u) if u.starts_with("http://") || u.starts_with("https://") => Some(u.to_string()),
            Some(_) => return Err(ConfigError::new("FLEET_LLM_BASE_URL", "must be an http(s) URL")),
            None => None,
        };
        let llm_api_key = src.get("FLEET_LLM_API_KEY").map(str::to_string);
        let llm_providers = provider_endpoints(src, &common, llm_base_url, llm_api_key)?;
        let redactor = std::sync::Arc::new(Redactor::new(configured_secrets(src, &common, &llm_providers)));
        let allow_private_callbacks = src.flag("FLEET_ALLOW_PRIVATE_CALLBACKS", false)?;
        let config = WorkerConfig {
            llm_providers,
            redactor,
            common,
            http_addr: socket_addr(src, "FLEET_WORKER_HTTP_ADDR", "127.0.0.1:9090")?,
            concurrency,
            secrets_key: fleet_platform::config::secrets_key(src)?,
            allow_private_callbacks,
            data_source_networks: data_source_networks(src, allow_private_callbacks)?,
            claim_lease,
            callback_timeout: src.seconds("FLEET_CALLBACK_TIMEOUT", Duration::from_secs(TOOL_CALLBACK_TIMEOUT_SECS))?,
            async_poll_interval: src.seconds("FLEET_ASYNC_POLL_INTERVAL", Duration::from_secs(2))?,
            async_poll_limit: src.seconds("FLEET_ASYNC_POLL_LIMIT", Duration::from_secs(ASYNC_POLL_LIMIT_SECS))?,
            shutdown_grace: src.seconds("FLEET_SHUTDOWN_GRACE", Duration::from_secs(25))?,
            liveness_grace: src.seconds("FLEET_LIVENESS_GRACE", Duration::from_secs(60))?,
            llm_timeout: src.seconds("FLEET_LLM_TIMEOUT", Duration::from_secs(120))?,
            llm_max_tokens: src.parse("FLEET_LLM_MAX_TOKENS", 4096)?,
            llm_max_response_bytes: src.parse("FLEET_LLM_MAX_RESPONSE_BYTES", 4 * 1024 * 1024)?,
            llm_models,
            llm_context_windows: fleet_protocol::turn::parse_context_windows(
                src.get("FLEET_LLM_CONTEXT_WINDOWS").unwrap_or(""),
            )
            .map_err(|why| ConfigError::new("FLEET_LLM_CONTEXT_WINDOWS", why))?,
            max_rounds: src.parse("FLEET_TURN_MAX_ROUNDS", fleet_protocol::turn::DEFAULT_MAX_ROUNDS)?,
            tenant_daily_tokens: fleet_protocol::tenant::parse_daily_caps(
                src.get("FLEET_TENANT_DAILY_TOKENS").unwrap_or(""),
            )
            .map_err(|why| ConfigError::new("FLEET_TENANT_DAILY_TOKENS", why))?,
            tenant_weights: per_tenant(src, "FLEET_TENANT_WEIGHTS")?,
            tenant_max_turns: per_tenant(src, "FLEET_TENANT_MAX_CONCURRENT_TURNS")?,
            metric_tenants: tenant::parse_tenants(src.get("FLEET_TENANTS").unwrap_or(""))
                .map_err(|why| ConfigError::new("FLEET_TENANTS", why))?,
            max_deliveries,
            tool_result_max_bytes,
            history_max_messages,
            history_max_bytes,
            registry_cache_ttl: src.seconds("FLEET_REGISTRY_CACHE", Duration::from_secs(2))?,
            worker_id: format!("{host}-{}", std::process::id()),
            circuit: circuit_policy(src)?,
        };
        Ok(config.name_metric_tenants(src))
    }
}

/// The secret values among the worker's settings: every model provider's key, the secrets key as
/// written, the API tokens (`FLEET_API_TOKENS`, if given) and the passwords in the broker's and
/// Redis's URLs (as written). The redactor ignores values shorter than
/// `redact::MIN_SECRET_LEN` (a default `guest` password is no secret, and would eat the word).
fn configured_secrets(src: &Source, common: &CommonConfig, providers: &[ProviderEndpoint]) -> Vec<String> {
    let mut secrets: Vec<String> = providers.iter().filter_map(|p| p.api_key.clone()).collect();
    secrets.extend(src.get("FLEET_SECRETS_KEY").map(str::to_string));
    let tokens = src.get("FLEET_API_TOKENS").unwrap_or("").split(',');
    secrets.extend(tokens.filter_map(|entry| entry.trim().split([':', '@']).next()).map(str::to_string));
    let urls = common.amqp_urls.iter().map(String::as_str).chain(common.redis_url.split(','));
    secrets.extend(urls.filter_map(|u| url::Url::parse(u.trim()).ok()?.password().map(str::to_string)));
    secrets
}

/// A `TENANT=N` list (each N at least 1).
fn per_tenant(src: &Source, name: &'static str) -> Result<std::collections::BTreeMap<String, u32>, ConfigError> {
    fleet_protocol::fair::parse_per_tenant(src.get(name).unwrap_or(""), 1).map_err(|why| ConfigError::new(name, why))
}

impl WorkerConfig {
    /// Adds to `metric_tenants` the tenants the per-tenant settings and `FLEET_API_TOKENS` name:
    /// the configuration's, so the label's values are bounded by it, never by what requests say
    /// (a `*` entry names no tenant).
    fn name_metric_tenants(mut self, src: &Source) -> Self {
        let listed =
            self.tenant_daily_tokens.keys().chain(self.tenant_weights.keys()).chain(self.tenant_max_turns.keys());
        let listed: Vec<String> = listed.filter(|t| tenant::is_tenant_name(t)).cloned().collect();
        self.metric_tenants.extend(listed);
        self.metric_tenants.extend(tenant::bound_in_tokens(src.get("FLEET_API_TOKENS").unwrap_or("")));
        self
    }
}

/// `FLEET_CIRCUIT_FAILURE_THRESHOLD` (0: circuits never open) and `FLEET_CIRCUIT_PROBE_INTERVAL`.
fn circuit_policy(src: &Source) -> Result<fleet_protocol::circuit::CircuitPolicy, ConfigError> {
    use fleet_protocol::circuit::{CircuitPolicy, DEFAULT_FAILURE_THRESHOLD, DEFAULT_PROBE_INTERVAL};
    let probe_interval = src.seconds("FLEET_CIRCUIT_PROBE_INTERVAL", DEFAULT_PROBE_INTERVAL)?;
    if probe_interval < Duration::from_millis(100) {
        return Err(ConfigError::new("FLEET_CIRCUIT_PROBE_INTERVAL", "must be at least 0.1 seconds"));
    }
    let failure_threshold = src.parse("FLEET_CIRCUIT_FAILURE_THRESHOLD", DEFAULT_FAILURE_THRESHOLD)?;
    Ok(CircuitPolicy { failure_threshold, probe_interval })
}

/// `FLEET_LLM_MODELS`: the models besides the default worth a `model` label of their own
/// (comma-separated, at most 50: each is a series).
fn configured_models(src: &Source, default_model: &str) -> Result<Vec<String>, ConfigError> {
    let mut models = vec![default_model.to_string()];
    for model in src.string("FLEET_LLM_MODELS", "").split(',').map(str::trim).filter(|m| !m.is_empty()) {
        if model.len() > 256 || model.chars().any(char::is_control) {
            return Err(ConfigError::new("FLEET_LLM_MODELS", format!("{model:?} is not a model name")));
        }
        if !models.iter().any(|m| m == model) {
            models.push(model.to_string());
        }
    }
    if models.len() > 51 {
        return Err(ConfigError::new("FLEET_LLM_MODELS", "names more than 50 models"));
    }
    Ok(models)
}

/// `FLEET_DATA_SOURCE_NETWORKS`: the private networks (CIDR, comma-separated) a data source may be
/// on without opening callbacks to them; `FLEET_ALLOW_PRIVATE_CALLBACKS` (`all`) opens all of them.
fn data_source_networks(src: &Source, all: bool) -> Result<fleet_platform::data_sources::PrivateNetworks, ConfigError> {
    let listed = fleet_platform::data_sources::PrivateNetworks::parse(&src.string("FLEET_DATA_SOURCE_NETWORKS", ""))
        .map_err(|e| ConfigError::new("FLEET_DATA_SOURCE_NETWORKS", e))?;
    Ok(listed.or_all(all))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn defaults_follow_the_seed() {
        let c = WorkerConfig::load(&Source::from_pairs([("FLEET_SECRETS_KEY", KEY)])).unwrap();
        assert_eq!(c.callback_timeout, Duration::from_secs(30));
        assert_eq!(c.async_poll_limit, Duration::from_secs(300));
        assert_eq!(c.http_addr.to_string(), "127.0.0.1:9090");
        assert!(!c.allow_private_callbacks);
        assert_eq!(c.data_source_networks, Default::default());
        assert_eq!(c.tool_result_max_bytes, 65536);
        assert_eq!((c.history_max_messages, c.history_max_bytes), (100, 256 * 1024));
        assert_eq!(c.circuit, fleet_protocol::circuit::CircuitPolicy::default());
    }

    #[test]
    fn every_configured_secret_is_redacted() {
        let c = WorkerConfig::load(&Source::from_pairs([
            ("FLEET_SECRETS_KEY", KEY),
            ("FLEET_LLM_API_KEY", "sk-default-provider-key"),
            ("FLEET_LLM_PROVIDERS", r#"{"b": {"base_url": "http://b/v1", "api_key_env": "B_KEY"}}"#),
            ("B_KEY", "second-provider-key"),
            ("FLEET_API_TOKENS", "operator-token-0001,tenant-token-0002@acme:turns:write"),
            ("FLEET_AMQP_URL", "amqp://fleet:broker-password-3@rabbit:5672/%2f"),
            ("FLEET_REDIS_URL", "redis://:redis-password-4@redis:6379/0"),
        ]))
        .unwrap();
        let text = format!(
            "{KEY} sk-default-provider-key second-provider-key operator-token-0001 tenant-token-0002 \
             broker-password-3 redis-password-4"
        );
        let redacted = c.redactor.redact(&text);
        assert_eq!(redacted, ["[redacted]"; 7].join(" "), "{redacted}");
        let defaults = WorkerConfig::load(&Source::from_pairs([("FLEET_SECRETS_KEY", KEY)])).unwrap();
        assert_eq!(defaults.redactor.redact("guest:guest"), "guest:guest", "the default password is no secret");
    }

    #[test]
    fn every_provider_gets_its_key_from_the_setting_it_names() {
        let providers =
            r#"{"b": {"base_url": "http://127.0.0.1:2/v1", "api_key_env": "B_KEY"}, "c": {"base_url": "http://c/v1"}}"#;
        let pairs = [
            ("FLEET_SECRETS_KEY", KEY),
            ("FLEET_LLM_BASE_URL", "http://127.0.0.1:1/v1"),
            ("FLEET_LLM_API_KEY", "sk-a"),
            ("FLEET_LLM_PROVIDERS", providers),
        ];
        let missing = WorkerConfig::load(&Source::from_pairs(pairs)).unwrap_err();
        assert_eq!(missing.setting, "B_KEY");
        let c = WorkerConfig::load(&Source::from_pairs(pairs.into_iter().chain([("B_KEY", "sk-b")]))).unwrap();
        let seen: Vec<_> = c.llm_providers.iter().map(|p| (p.name.as_str(), p.api_key.as_deref())).collect();
        assert_eq!(seen, [("openai", Some("sk-a")), ("b", Some("sk-b")), ("c", None)]);
        assert!(!format!("{:?}", c.llm_providers).contains("sk-b"), "keys are not printed");
    }

    #[test]
    fn bad_settings_are_named() {
        let load = |k, v| WorkerConfig::load(&Source::from_pairs([("FLEET_SECRETS_KEY", KEY), (k, v)]));
        assert_eq!(load("FLEET_WORKER_CONCURRENCY", "0").unwrap_err().setting, "FLEET_WORKER_CONCURRENCY");
        assert_eq!(load("FLEET_WORKER_CONCURRENCY", "many").unwrap_err().setting, "FLEET_WORKER_CONCURRENCY");
        assert_eq!(load("FLEET_CLAIM_LEASE", "0.01").unwrap_err().setting, "FLEET_CLAIM_LEASE");
        let setting = "FLEET_CIRCUIT_FAILURE_THRESHOLD";
        assert_eq!(load(setting, "-1").unwrap_err().setting, setting);
        assert_eq!(load("FLEET_CIRCUIT_PROBE_INTERVAL", "0").unwrap_err().setting, "FLEET_CIRCUIT_PROBE_INTERVAL");
        assert_eq!(load("FLEET_TOOL_RESULT_MAX_BYTES", "10").unwrap_err().setting, "FLEET_TOOL_RESULT_MAX_BYTES");
        let setting = "FLEET_SESSION_HISTORY_MAX_MESSAGES";
        assert_eq!(load(setting, "0").unwrap_err().setting, setting);
        let setting = "FLEET_SESSION_HISTORY_MAX_BYTES";
        assert_eq!(load(setting, "10").unwrap_err().setting, setting);
        assert_eq!(
            load("FLEET_ALLOW_PRIVATE_CALLBACKS", "maybe").unwrap_err().setting,
            "FLEET_ALLOW_PRIVATE_CALLBACKS"
        );
    }

    #[test]
    fn data_sources_reach_the_listed_private_networks() {
        let load = |pairs: &[(&str, &str)]| {
            let mut all = vec![("FLEET_SECRETS_KEY", KEY)];
            all.extend_from_slice(pairs);
            WorkerConfig::load(&Source::from_pairs(all))
        };
        let c = load(&[("FLEET_DATA_SOURCE_NETWORKS", "10.20.0.0/16")]).unwrap();
        assert!(c.data_source_networks.permits("10.20.1.2".parse().unwrap()));
        assert!(!c.data_source_networks.permits("10.21.1.2".parse().unwrap()));
        assert!(!c.allow_private_callbacks, "callbacks stay public");
        let c = load(&[("FLEET_ALLOW_PRIVATE_CALLBACKS", "true")]).unwrap();
        assert!(c.data_source_networks.permits("127.0.0.1".parse().unwrap()));
        let e = load(&[("FLEET_DATA_SOURCE_NETWORKS", "10.0.0.0/33")]).unwrap_err();
        assert_eq!(e.setting, "FLEET_DATA_SOURCE_NETWORKS");
    }
}
