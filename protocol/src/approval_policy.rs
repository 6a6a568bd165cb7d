//! Which tool calls wait for an operator (issue 47, after seed 002's `effects` /
//! `requiresApproval`): a tool's and a tool configuration's settings, and the pure check
//! `needs_approval` over them. A leaf: tool definitions name it, and `approvals` builds on it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How long an approval waits for a decision unless its tool says otherwise: an hour.
pub const DEFAULT_APPROVAL_TIMEOUT_SECS: u64 = 3600;
/// The longest a tool may make an approval wait: 30 days (the furthest the broker holds a job).
pub const MAX_APPROVAL_TIMEOUT_SECS: u64 = 30 * 86_400;
/// How long a decided approval stays readable after its deadline.
pub const APPROVAL_RETENTION_SECS: u64 = 7 * 86_400;
/// The model's error code for a call an operator denied.
pub const APPROVAL_DENIED: &str = "APPROVAL_DENIED";
/// The model's error code for a call nobody decided in time, when its tool's outcome is `deny`.
pub const APPROVAL_TIMEOUT: &str = "APPROVAL_TIMEOUT";
/// The stream event that asks for a decision.
pub const APPROVAL_REQUEST_EVENT: &str = "approval_request";

/// What a tool's call does beyond answering (seed 002's `effects`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    Read,
    Write,
    Execute,
    Network,
}

impl Effect {
    pub const ALL: [Effect; 4] = [Effect::Read, Effect::Write, Effect::Execute, Effect::Network];

    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Read => "read",
            Effect::Write => "write",
            Effect::Execute => "execute",
            Effect::Network => "network",
        }
    }

    /// The effects `names` list, in order, each once; the first unknown one is the error, named.
    pub fn parse_all(field: &str, names: &[String]) -> Result<Vec<Effect>, String> {
        let mut effects = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let Some(effect) = Effect::ALL.into_iter().find(|e| e.as_str() == name) else {
                return Err(format!("{field}[{i}]: unknown effect {name:?}; one of read, write, execute, network"));
            };
            if !effects.contains(&effect) {
                effects.push(effect);
            }
        }
        Ok(effects)
    }
}

/// What a call becomes when nobody decided by its deadline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TimeoutOutcome {
    #[default]
    Deny,
    Approve,
}

/// A tool's (or a tool configuration's) approval settings, as registered. All optional, so a
/// configuration states only what it adds to its tool's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct ApprovalSettings {
    /// What its calls do (seed 002's `effects`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub effects: Vec<Effect>,
    /// Whether each call waits for an operator's decision (`POST /v1/approvals/{id}`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requires_approval: bool,
    /// How long a call waits for its decision (default 3600, at most 30 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schema(minimum = 1, maximum = 2592000))]
    pub approval_timeout_secs: Option<u64>,
    /// What a call becomes when nobody decided in time (default `deny`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_timeout_outcome: Option<TimeoutOutcome>,
}

impl ApprovalSettings {
    pub fn is_default(&self) -> bool {
        *self == ApprovalSettings::default()
    }

    /// The first setting out of range, named.
    pub fn problem(&self, field: &str) -> Option<String> {
        let timeout = self.approval_timeout_secs?;
        (timeout == 0 || timeout > MAX_APPROVAL_TIMEOUT_SECS).then(|| {
            format!("{field}approval_timeout_secs: must be 1-{MAX_APPROVAL_TIMEOUT_SECS} seconds, not {timeout}")
        })
    }
}

/// How a call that needs approval waits: its deadline's length and what it becomes then, and the
/// effects the operator is shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalPolicy {
    pub timeout_secs: u64,
    pub timeout_outcome: TimeoutOutcome,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub effects: Vec<Effect>,
}

/// Whether a call of `tool` (through `configuration`, an agent's configured use of it, if so)
/// waits for an operator. A configuration may ask for approval its tool does not, never waive its
/// tool's; its timeout settings come first. Another kind of tool joins with its own settings: an
/// MCP tool passes `requires_approval: destructive_hint && policy.requires_approval_for_destructive`.
pub fn needs_approval(tool: &ApprovalSettings, configuration: Option<&ApprovalSettings>) -> Option<ApprovalPolicy> {
    let configured = configuration.is_some_and(|c| c.requires_approval);
    if !tool.requires_approval && !configured {
        return None;
    }
    let pick = |own: Option<u64>, base: Option<u64>| own.or(base);
    let timeout_secs = pick(configuration.and_then(|c| c.approval_timeout_secs), tool.approval_timeout_secs)
        .unwrap_or(DEFAULT_APPROVAL_TIMEOUT_SECS)
        .clamp(1, MAX_APPROVAL_TIMEOUT_SECS);
    let timeout_outcome =
        configuration.and_then(|c| c.approval_timeout_outcome).or(tool.approval_timeout_outcome).unwrap_or_default();
    let mut effects = tool.effects.clone();
    effects.extend(configuration.map(|c| c.effects.as_slice()).unwrap_or_default());
    effects.sort_unstable();
    effects.dedup();
    Some(ApprovalPolicy { timeout_secs, timeout_outcome, effects })
}

/// Whether a call's stored result is an approval's refusal (a copy reporting it to its turn
/// reports a failure, not a success).
pub fn is_refusal(result: &Value) -> bool {
    result["status"] == "failed"
        && result["error"]["code"].as_str().is_some_and(|c| c == APPROVAL_DENIED || c == APPROVAL_TIMEOUT)
}
