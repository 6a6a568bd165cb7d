//! Model-provider budgets: a provider's (and optionally a model's) `requests_per_minute` and
//! `tokens_per_minute`, as the GCRA buckets one Redis script spends from fleet-wide (in the fair
//! order of `crate::fair`); what a model call is estimated to cost before it runs; and what a
//! provider's answer says about its own limits (`Retry-After`, `x-ratelimit-*`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

/// How far ahead of the steady rate a budget lets calls run, unless configured: a tenth of a
/// minute's worth at once. Less than the provider's own minute, so the few milliseconds by which
/// a parked step comes back late never bunch calls into more than the provider allows.
pub const DEFAULT_BURST_SECONDS: u32 = 10;

/// A budget as configured: per provider (in its `FLEET_LLM_PROVIDERS` entry, or
/// `FLEET_LLM_BUDGET` for the default provider), with optional per-model budgets under `models`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
    /// How many seconds' worth of the rate may go at once (1-60, default 10).
    #[serde(default)]
    pub burst_seconds: Option<u32>,
    /// Budgets of single models of this provider, on top of the provider's.
    #[serde(default)]
    pub models: BTreeMap<String, ModelBudget>,
}

/// A model's own budget within its provider's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelBudget {
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
}

impl Budget {
    /// Whether the budget limits anything at all.
    pub fn is_none(&self) -> bool {
        self.requests_per_minute.is_none()
            && self.tokens_per_minute.is_none()
            && self.models.values().all(|m| m.requests_per_minute.is_none() && m.tokens_per_minute.is_none())
    }

    /// The problem with the budget, if any (named by field).
    pub fn check(&self) -> Result<(), String> {
        let positive = |what: &str, n: Option<u64>| match n {
            Some(0) => Err(format!("{what} must be at least 1")),
            _ => Ok(()),
        };
        positive("requests_per_minute", self.requests_per_minute.map(u64::from))?;
        positive("tokens_per_minute", self.tokens_per_minute)?;
        if let Some(b) = self.burst_seconds {
            if !(1..=60).contains(&b) {
                return Err("burst_seconds must be from 1 to 60".into());
            }
        }
        for (name, m) in &self.models {
            if name.is_empty() || name.len() > 256 || name.chars().any(char::is_control) {
                return Err(format!("models: {name:?} is not a model name"));
            }
            positive(&format!("models.{name}.requests_per_minute"), m.requests_per_minute.map(u64::from))?;
            positive(&format!("models.{name}.tokens_per_minute"), m.tokens_per_minute)?;
        }
        Ok(())
    }

    /// The buckets a call to `model` reserves from: the provider's, then the model's if it has one.
    /// A model without its own budget adds none (its name is a client's choice, so only
    /// configured models get a bucket of their own).
    pub fn buckets(&self, model: &str) -> Vec<Bucket> {
        let burst = f64::from(self.burst_seconds.unwrap_or(DEFAULT_BURST_SECONDS)) * 1000.0;
        let mut out = Vec::new();
        let mut add = |name: String, unit: Unit, per_minute: Option<u64>| {
            if let Some(n) = per_minute {
                let interval_ms = 60_000.0 / n as f64;
                out.push(Bucket { name, unit, interval_ms, tolerance_ms: burst });
            }
        };
        add("req".into(), Unit::Requests, self.requests_per_minute.map(u64::from));
        add("tok".into(), Unit::Tokens, self.tokens_per_minute);
        if let Some(m) = self.models.get(model) {
            add(format!("req:m:{model}"), Unit::Requests, m.requests_per_minute.map(u64::from));
            add(format!("tok:m:{model}"), Unit::Tokens, m.tokens_per_minute);
        }
        out
    }
}

/// What a bucket counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Requests,
    Tokens,
}

impl Unit {
    /// The `unit` label, and the script's name for it.
    pub fn label(self) -> &'static str {
        match self {
            Unit::Requests => "requests",
            Unit::Tokens => "tokens",
        }
    }
}

/// One GCRA bucket: a unit costs `interval_ms`, and up to `tolerance_ms` of them may be spent
/// ahead of the steady rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    /// Its member in the provider's budget key (`req`, `tok`, `req:m:<model>`, `tok:m:<model>`).
    pub name: String,
    pub unit: Unit,
    pub interval_ms: f64,
    pub tolerance_ms: f64,
}

impl Bucket {
    /// What a call of `tokens` costs in this bucket's unit.
    pub fn cost(&self, tokens: u64) -> f64 {
        match self.unit {
            Unit::Requests => 1.0,
            Unit::Tokens => tokens as f64,
        }
    }
}

/// The tokens a model call may use, reserved before it runs: its prompt, estimated at four bytes
/// of JSON per token (messages and tool specs), plus every token it may answer with.
pub fn estimate_tokens(messages: &[Value], tools: &[Value], max_tokens: u32) -> u64 {
    let bytes: usize = messages.iter().chain(tools).map(|v| v.to_string().len()).sum();
    (bytes as u64).div_ceil(4) + u64::from(max_tokens)
}

/// What a provider's answer says about its limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProviderLimits {
    pub remaining_requests: Option<u64>,
    pub remaining_tokens: Option<u64>,
    pub reset_requests: Option<Duration>,
    pub reset_tokens: Option<Duration>,
}

impl ProviderLimits {
    /// Reads `x-ratelimit-{remaining,reset}-{requests,tokens}` (OpenAI's names; a reset is
    /// `1s`, `6m0s`, `20ms` or plain seconds). `header` looks a header up by lower-case name.
    pub fn from_headers<'a>(header: impl Fn(&str) -> Option<&'a str>) -> Self {
        let number = |name: &str| header(name).and_then(|v| v.trim().parse::<u64>().ok());
        let duration = |name: &str| header(name).and_then(parse_reset);
        ProviderLimits {
            remaining_requests: number("x-ratelimit-remaining-requests"),
            remaining_tokens: number("x-ratelimit-remaining-tokens"),
            reset_requests: duration("x-ratelimit-reset-requests"),
            reset_tokens: duration("x-ratelimit-reset-tokens"),
        }
    }

    /// How long the provider takes no more calls, by its own account: a limit that has nothing
    /// remaining until its reset.
    pub fn exhausted_for(&self) -> Option<Duration> {
        let requests = (self.remaining_requests == Some(0)).then_some(self.reset_requests).flatten();
        let tokens = (self.remaining_tokens == Some(0)).then_some(self.reset_tokens).flatten();
        requests.max(tokens)
    }
}

/// A reset time as providers write it: `6m0s`, `1.5s`, `20ms`, `1h2m`, or a number of seconds.
pub fn parse_reset(raw: &str) -> Option<Duration> {
    let raw = raw.trim();
    if let Ok(seconds) = raw.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds.min(86_400.0)));
    }
    let mut total = 0.0;
    let mut rest = raw;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.')?;
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (scale, len) = match () {
            _ if rest.starts_with("ms") => (0.001, 2),
            _ if rest.starts_with('h') => (3600.0, 1),
            _ if rest.starts_with('m') => (60.0, 1),
            _ if rest.starts_with('s') => (1.0, 1),
            _ => return None,
        };
        total += value * scale;
        rest = &rest[len..];
    }
    (total.is_finite() && !raw.is_empty()).then(|| Duration::from_secs_f64(total.min(86_400.0)))
}

/// How long a provider's 429 pauses it fleet-wide: its `Retry-After`, else its own reset time,
/// else one second; never more than a minute (a provider's limits are per minute).
pub fn pause_after_429(retry_after: Option<Duration>, limits: &ProviderLimits) -> Duration {
    let reset = limits.reset_requests.max(limits.reset_tokens);
    retry_after.or(reset).unwrap_or(Duration::from_secs(1)).clamp(Duration::from_millis(100), Duration::from_secs(60))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn budget(rpm: u32, tpm: u64) -> Budget {
        Budget { requests_per_minute: Some(rpm), tokens_per_minute: Some(tpm), ..Default::default() }
    }

    #[test]
    fn a_budget_is_checked_and_names_its_field() {
        assert!(budget(600, 200_000).check().is_ok());
        assert_eq!(budget(0, 1).check().unwrap_err(), "requests_per_minute must be at least 1");
        let burst = Budget { burst_seconds: Some(61), ..budget(1, 1) };
        assert_eq!(burst.check().unwrap_err(), "burst_seconds must be from 1 to 60");
        let raw = r#"{"requests_per_minute": 10, "models": {"m": {"tokens_per_minute": 0}}}"#;
        let parsed: Budget = serde_json::from_str(raw).unwrap();
        assert_eq!(parsed.check().unwrap_err(), "models.m.tokens_per_minute must be at least 1");
        assert!(serde_json::from_str::<Budget>(r#"{"rpm": 1}"#).is_err(), "unknown fields are refused");
        assert!(Budget::default().is_none());
    }

    #[test]
    fn only_configured_models_get_a_bucket() {
        let mut b = budget(600, 60_000);
        b.models.insert("big".into(), ModelBudget { requests_per_minute: None, tokens_per_minute: Some(6_000) });
        let names = |m| b.buckets(m).into_iter().map(|b| b.name).collect::<Vec<_>>();
        assert_eq!(names("big"), ["req", "tok", "tok:m:big"]);
        assert_eq!(names("anything-else"), ["req", "tok"]);
        let req = &b.buckets("x")[0];
        assert_eq!((req.interval_ms, req.tolerance_ms), (100.0, 10_000.0));
    }

    #[test]
    fn a_call_is_estimated_by_its_prompt_and_answer() {
        let messages = [json!({"role": "user", "content": "x".repeat(390)})];
        // 418 bytes of JSON: 105 tokens.
        assert_eq!(estimate_tokens(&messages, &[], 100), 100 + 105);
    }

    #[test]
    fn limit_headers_are_read() {
        let headers = [
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1m30s"),
            ("x-ratelimit-remaining-tokens", "1200"),
            ("x-ratelimit-reset-tokens", "20ms"),
        ];
        let limits = ProviderLimits::from_headers(|n| headers.iter().find(|(k, _)| *k == n).map(|(_, v)| *v));
        assert_eq!(limits.remaining_requests, Some(0));
        assert_eq!(limits.reset_tokens, Some(Duration::from_millis(20)));
        assert_eq!(limits.exhausted_for(), Some(Duration::from_secs(90)));
        assert_eq!(parse_reset("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_reset("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_reset("soon"), None);
    }

    #[test]
    fn a_429_pauses_for_what_it_asks_within_a_minute() {
        let none = ProviderLimits::default();
        assert_eq!(pause_after_429(None, &none), Duration::from_secs(1));
        assert_eq!(pause_after_429(Some(Duration::from_secs(3)), &none), Duration::from_secs(3));
        assert_eq!(pause_after_429(Some(Duration::from_secs(3600)), &none), Duration::from_secs(60));
        let reset = ProviderLimits { reset_tokens: Some(Duration::from_secs(7)), ..none };
        assert_eq!(pause_after_429(None, &reset), Duration::from_secs(7));
    }
}
