//! Approvals (issue 47, after seed 002's tool `effects` / `requiresApproval`): which calls wait for
//! an operator's decision (`needs_approval`), what an approval is, how a decision or its deadline
//! settles it, and what the model is told of a call that was refused. Pure: the dispatcher and the
//! workers do the writes, each conditional on the state decided here.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

pub use crate::approval_policy::*;
use crate::external_result::{ExternalResult, InteractionError, ResultStatus};

/// Where an approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    Pending,
    Approved,
    Denied,
    /// Nobody decided by the deadline: the tool's `timeout_outcome` applies.
    TimedOut,
}

impl ApprovalStatus {
    pub const ALL: [ApprovalStatus; 4] =
        [ApprovalStatus::Pending, ApprovalStatus::Approved, ApprovalStatus::Denied, ApprovalStatus::TimedOut];

    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Denied => "denied",
            ApprovalStatus::TimedOut => "timed_out",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// An operator's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ApprovalDecision {
    Approve,
    Deny,
}

impl ApprovalDecision {
    /// The status the decision leaves its approval in.
    pub fn status(self) -> ApprovalStatus {
        match self {
            ApprovalDecision::Approve => ApprovalStatus::Approved,
            ApprovalDecision::Deny => ApprovalStatus::Denied,
        }
    }
}

/// Who decided, when and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Decided {
    /// `token:<digest prefix>`, `console:<login>`, or `deadline`.
    pub by: String,
    /// RFC 3339.
    pub at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One call waiting for (or settled by) a decision. The call's arguments are shown with anything
/// secret-shaped masked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Approval {
    /// `apr_` and 32 hex digits (those of the call's execution id).
    pub id: String,
    pub status: ApprovalStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The session's stored id (a tenant's is shown as its key by the API).
    pub session_id: String,
    /// The turn that made the call.
    pub turn_execution_id: String,
    /// The execution that runs the call once approved.
    pub call_execution_id: String,
    /// The model's id for the call.
    pub call_id: String,
    pub tool_name: String,
    /// The agent's tool configuration the model called, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_configuration_name: Option<String>,
    #[cfg_attr(feature = "schema", schema(value_type = Object))]
    pub parameters: Value,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub effects: Vec<Effect>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339: when `timeout_outcome` applies if nobody decided.
    pub deadline: String,
    pub timeout_outcome: TimeoutOutcome,
    /// Set once decided (by an operator or the deadline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided: Option<Decided>,
}

/// The id of the approval that holds the call `call_execution_id` (derived, so every copy of the
/// step that made the call names the same one).
pub fn approval_id(call_execution_id: &str) -> String {
    format!("apr_{}", call_execution_id.strip_prefix("exec_").unwrap_or(call_execution_id))
}

/// Whether `s` has an approval id's shape (a path segment that cannot is not found).
pub fn is_approval_id(s: &str) -> bool {
    s.strip_prefix("apr_").is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// What a decision request does to an approval in `current`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionVerdict {
    /// Pending: the decision is taken (written only if still pending).
    Take,
    /// Decided so already: answered as it stands (a repeated request).
    Same,
    /// Decided otherwise (or by its deadline): 409.
    Conflict,
}

pub fn judge_decision(current: ApprovalStatus, requested: ApprovalDecision) -> DecisionVerdict {
    match current {
        ApprovalStatus::Pending => DecisionVerdict::Take,
        status if status == requested.status() => DecisionVerdict::Same,
        _ => DecisionVerdict::Conflict,
    }
}

/// What a call's job does with its approval, when it is delivered.
#[derive(Debug, Clone, PartialEq)]
pub enum CallGate {
    /// Approved (by an operator or its deadline): the call runs as it would have.
    Run,
    /// Refused: the call ends with this result, nothing sent.
    Refuse(Box<ExternalResult>),
    /// Still pending before its deadline: the job waits this long more (ms), in the broker.
    Wait(i64),
    /// Pending past its deadline: the deadline decides it (a conditional write), then ask again.
    Expire,
}

/// The gate of a call held by `approval` at `now_ms` (`deadline_ms` its deadline).
pub fn call_gate(approval: &Approval, deadline_ms: i64, now_ms: i64) -> CallGate {
    let reason = approval.decided.as_ref().and_then(|d| d.reason.as_deref());
    match approval.status {
        ApprovalStatus::Approved => CallGate::Run,
        ApprovalStatus::Denied => CallGate::Refuse(Box::new(denied_result(approval, APPROVAL_DENIED, reason))),
        ApprovalStatus::TimedOut => match approval.timeout_outcome {
            TimeoutOutcome::Approve => CallGate::Run,
            TimeoutOutcome::Deny => CallGate::Refuse(Box::new(denied_result(approval, APPROVAL_TIMEOUT, None))),
        },
        ApprovalStatus::Pending if now_ms >= deadline_ms => CallGate::Expire,
        ApprovalStatus::Pending => CallGate::Wait(deadline_ms - now_ms),
    }
}

/// Seed 002's result for a refused call: `failed`, with `code` and the operator's reason (kept
/// only if safe to show) as its message.
pub fn denied_result(approval: &Approval, code: &str, reason: Option<&str>) -> ExternalResult {
    let fallback = match code {
        APPROVAL_TIMEOUT => "No decision was made before the approval's deadline",
        _ => "An operator denied this call",
    };
    let message = reason.map(str::trim).filter(|r| !r.is_empty()).unwrap_or(fallback);
    let error = InteractionError::safe(code, message, Some(false));
    ExternalResult::ended(&approval.call_id, &approval.tool_name, ResultStatus::Failed, error)
}

/// The session event asking for a decision.
pub fn approval_request_event(approval: &Approval, message_id: &str) -> Value {
    json!({
        "type": APPROVAL_REQUEST_EVENT,
        "approval_id": approval.id,
        "tool_call": {"id": approval.call_id, "name": approval.tool_name, "parameters": approval.parameters},
        "tool_name": approval.tool_name,
        "tool_configuration_name": approval.tool_configuration_name,
        "effects": approval.effects,
        "deadline": approval.deadline,
        "timeout_outcome": approval.timeout_outcome,
        "message_id": message_id,
    })
}

/// Names whose values an approval never shows (matched anywhere in a key, any case).
const SECRET_NAMES: [&str; 9] =
    ["password", "passwd", "secret", "token", "api_key", "apikey", "authorization", "credential", "private_key"];

/// The call's arguments as an approval shows them: a value under a secret-sounding key is `****`,
/// as is any string the redactor finds credential-shaped.
pub fn masked_parameters(parameters: &Value) -> Value {
    match parameters {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let lower = k.to_ascii_lowercase();
                    let secret = SECRET_NAMES.iter().any(|n| lower.contains(n));
                    (k.clone(), if secret { json!("****") } else { masked_parameters(v) })
                })
                .collect::<Map<String, Value>>(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(masked_parameters).collect()),
        Value::String(s) => {
            let redactor = crate::redact::Redactor::new(Vec::<String>::new());
            Value::String(redactor.redact(s).into_owned())
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(requires: bool, timeout: Option<u64>, outcome: Option<TimeoutOutcome>) -> ApprovalSettings {
        ApprovalSettings {
            effects: vec![],
            requires_approval: requires,
            approval_timeout_secs: timeout,
            approval_timeout_outcome: outcome,
        }
    }

    fn approval(status: ApprovalStatus, outcome: TimeoutOutcome, reason: Option<&str>) -> Approval {
        Approval {
            id: approval_id("exec_0123456789abcdef0123456789abcdef"),
            status,
            tenant: None,
            session_id: "s".into(),
            turn_execution_id: "exec_t".into(),
            call_execution_id: "exec_0123456789abcdef0123456789abcdef".into(),
            call_id: "call_1".into(),
            tool_name: "delete_rows".into(),
            tool_configuration_name: None,
            parameters: json!({}),
            effects: vec![Effect::Write],
            created_at: "2026-01-20T12:00:00Z".into(),
            deadline: "2026-01-20T13:00:00Z".into(),
            timeout_outcome: outcome,
            decided: reason.map(|r| Decided {
                by: "token:ab".into(),
                at: "2026-01-20T12:01:00Z".into(),
                reason: Some(r.into()),
            }),
        }
    }

    #[test]
    fn a_call_waits_when_its_tool_or_its_configuration_asks_and_the_configuration_sets_the_timeout() {
        assert_eq!(needs_approval(&settings(false, Some(5), None), None), None);
        assert_eq!(needs_approval(&settings(false, None, None), Some(&settings(false, Some(5), None))), None);
        let tool = settings(true, None, None);
        let policy = ApprovalPolicy {
            timeout_secs: DEFAULT_APPROVAL_TIMEOUT_SECS,
            timeout_outcome: TimeoutOutcome::Deny,
            effects: vec![],
        };
        assert_eq!(needs_approval(&tool, None), Some(policy));
        // A configuration cannot waive its tool's approval, but may ask for one and set its own timeout.
        let configuration = settings(false, Some(5), Some(TimeoutOutcome::Approve));
        let own = ApprovalPolicy { timeout_secs: 5, timeout_outcome: TimeoutOutcome::Approve, effects: vec![] };
        assert_eq!(needs_approval(&tool, Some(&configuration)), Some(own));
        let asks = settings(true, None, None);
        assert_eq!(needs_approval(&settings(false, Some(9), None), Some(&asks)).unwrap().timeout_secs, 9);
    }

    #[test]
    fn effects_parse_once_each_and_an_unknown_one_is_named() {
        let names = ["write".to_string(), "network".into(), "write".into()];
        assert_eq!(Effect::parse_all("effects", &names), Ok(vec![Effect::Write, Effect::Network]));
        let e = Effect::parse_all("effects", &["read".into(), "teleport".into()]).unwrap_err();
        assert!(e.starts_with("effects[1]") && e.contains("\"teleport\""), "{e}");
        assert!(settings(true, Some(0), None).problem("").is_some());
        assert!(settings(true, Some(MAX_APPROVAL_TIMEOUT_SECS + 1), None).problem("").is_some());
        assert_eq!(settings(true, Some(60), None).problem(""), None);
    }

    #[test]
    fn a_decision_is_taken_once_repeated_as_it_stands_and_a_different_one_conflicts() {
        use ApprovalStatus::*;
        assert_eq!(judge_decision(Pending, ApprovalDecision::Deny), DecisionVerdict::Take);
        assert_eq!(judge_decision(Approved, ApprovalDecision::Approve), DecisionVerdict::Same);
        assert_eq!(judge_decision(Denied, ApprovalDecision::Deny), DecisionVerdict::Same);
        assert_eq!(judge_decision(Denied, ApprovalDecision::Approve), DecisionVerdict::Conflict);
        assert_eq!(judge_decision(TimedOut, ApprovalDecision::Deny), DecisionVerdict::Conflict);
    }

    #[test]
    fn the_gate_runs_refuses_waits_or_expires() {
        use ApprovalStatus::*;
        let deny = TimeoutOutcome::Deny;
        assert_eq!(call_gate(&approval(Approved, deny, None), 100, 50), CallGate::Run);
        assert_eq!(call_gate(&approval(Pending, deny, None), 100, 40), CallGate::Wait(60));
        assert_eq!(call_gate(&approval(Pending, deny, None), 100, 100), CallGate::Expire);
        assert_eq!(call_gate(&approval(TimedOut, TimeoutOutcome::Approve, None), 100, 200), CallGate::Run);
        let CallGate::Refuse(denied) = call_gate(&approval(Denied, deny, Some("not on a Friday")), 100, 50) else {
            panic!("refused")
        };
        assert_eq!(denied.status, ResultStatus::Failed);
        let error = denied.error.unwrap();
        assert_eq!((error.code.as_str(), error.message.as_str()), (APPROVAL_DENIED, "not on a Friday"));
        let CallGate::Refuse(late) = call_gate(&approval(TimedOut, deny, None), 100, 200) else { panic!("refused") };
        assert_eq!(late.error.unwrap().code, APPROVAL_TIMEOUT);
        // A reason that would leak something is replaced, never shown.
        let CallGate::Refuse(unsafe_reason) = call_gate(&approval(Denied, deny, Some("see /etc/passwd")), 100, 50)
        else {
            panic!("refused")
        };
        assert_eq!(unsafe_reason.error.unwrap().code, APPROVAL_DENIED);
    }

    #[test]
    fn ids_derive_from_the_call_and_parameters_are_shown_masked() {
        let id = approval_id("exec_0123456789abcdef0123456789abcdef");
        assert_eq!(id, "apr_0123456789abcdef0123456789abcdef");
        assert!(
            is_approval_id(&id) && !is_approval_id("apr_1") && !is_approval_id("exec_0123456789abcdef0123456789abcdef")
        );
        let shown =
            masked_parameters(&json!({"table": "users", "auth": {"API_Key": "k-1"}, "rows": [{"password": "p"}]}));
        assert_eq!(shown, json!({"table": "users", "auth": {"API_Key": "****"}, "rows": [{"password": "****"}]}));
    }
}
