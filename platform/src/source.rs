//! Where settings come from (the environment over an optional `FLEET_CONFIG_FILE` of `KEY=VALUE`
//! lines) and the error that names a setting: a bottom module, read by the typed configuration
//! and by each part that loads its own settings (TLS).

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

/// A setting that is missing or cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration error: {setting}: {problem}")]
pub struct ConfigError {
    pub setting: String,
    pub problem: String,
}

impl ConfigError {
    pub fn new(setting: &str, problem: impl Into<String>) -> Self {
        ConfigError { setting: setting.to_string(), problem: problem.into() }
    }
}

/// Where settings come from: the environment over an optional file.
#[derive(Debug, Clone, Default)]
pub struct Source {
    values: HashMap<String, String>,
}

impl Source {
    /// The process environment, over `FLEET_CONFIG_FILE` if set.
    pub fn from_env() -> Result<Self, ConfigError> {
        let mut values = HashMap::new();
        if let Ok(path) = std::env::var("FLEET_CONFIG_FILE") {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| ConfigError::new("FLEET_CONFIG_FILE", format!("cannot read {path}: {e}")))?;
            values.extend(parse_env_file(&text));
        }
        values.extend(std::env::vars());
        Ok(Source { values })
    }

    /// Settings from explicit pairs (for tests).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Source { values: pairs.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }

    /// The raw value, with blank values treated as unset.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(|s| s.trim()).filter(|s| !s.is_empty())
    }

    /// The value as set, blank included (a setting whose empty value means something).
    pub fn raw(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    pub fn string(&self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or(default).to_string()
    }

    pub fn required(&self, name: &str) -> Result<&str, ConfigError> {
        self.get(name).ok_or_else(|| ConfigError::new(name, "is required but not set"))
    }

    pub fn parse<T: FromStr>(&self, name: &str, default: T) -> Result<T, ConfigError>
    where
        T::Err: std::fmt::Display,
    {
        match self.get(name) {
            None => Ok(default),
            Some(raw) => raw.parse().map_err(|e| ConfigError::new(name, format!("cannot parse {raw:?}: {e}"))),
        }
    }

    pub fn flag(&self, name: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(name).map(str::to_ascii_lowercase).as_deref() {
            None => Ok(default),
            Some("1" | "true" | "yes" | "on") => Ok(true),
            Some("0" | "false" | "no" | "off") => Ok(false),
            Some(other) => Err(ConfigError::new(name, format!("must be true or false, got {other:?}"))),
        }
    }

    /// A duration in seconds (fractions allowed: `0.25`).
    pub fn seconds(&self, name: &str, default: Duration) -> Result<Duration, ConfigError> {
        match self.get(name) {
            None => Ok(default),
            Some(raw) => parse_seconds(raw).map_err(|p| ConfigError::new(name, p)),
        }
    }
}

pub(crate) fn parse_seconds(raw: &str) -> Result<Duration, String> {
    let secs: f64 = raw.parse().map_err(|_| format!("must be a number of seconds, got {raw:?}"))?;
    if !(0.0..=86_400.0 * 365.0).contains(&secs) || !secs.is_finite() {
        return Err(format!("must be between 0 and one year of seconds, got {raw:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

pub(crate) fn parse_env_file(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
        .collect()
}
