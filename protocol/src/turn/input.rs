//! A turn as submitted: the `POST /v1/turns` body (the seed's assistant object and `model_config`,
//! the messages, the behavior), its defaults and its checks.

use serde::{Deserialize, Serialize};

use crate::fair::Priority;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Behavior {
    /// Runs after the session's current turn, in arrival order.
    #[default]
    FollowUp,
    /// Joins the running turn's conversation at its next model call.
    Steer,
}

/// The temperature a turn's model call uses when its `model_config` names none (the seed's).
pub const DEFAULT_TEMPERATURE: f64 = 0.7;

/// The seed's `model_config`: every field optional (the fleet's defaults apply). The dispatcher
/// fills `provider`, `model` and `temperature` from its settings before the turn is stored, so the
/// turn's state says what ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// A configured provider (`FLEET_LLM_DEFAULT_PROVIDER`, default `openai`, or a name in
    /// `FLEET_LLM_PROVIDERS`); an unknown one is a 422. Default: `FLEET_LLM_DEFAULT_PROVIDER`.
    #[serde(default)]
    pub provider: Option<String>,
    /// Default: `FLEET_LLM_DEFAULT_MODEL` (`gpt-4o`).
    #[serde(default)]
    pub model: Option<String>,
    /// 0-2 on a turn (an assistant's: 0-1, the seed's range); default 0.7.
    #[cfg_attr(feature = "schema", schema(minimum = 0, maximum = 2))]
    #[serde(default)]
    pub temperature: Option<f64>,
    /// The most tokens one model call may generate, 1-1000000; default `FLEET_LLM_MAX_TOKENS`.
    #[cfg_attr(feature = "schema", schema(minimum = 1, maximum = 1000000))]
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// The most tokens the model accepts in one request (its context window), 1-10000000; default
    /// the fleet's for the model (`FLEET_LLM_CONTEXT_WINDOWS`), else unchecked. A turn whose prompt
    /// is estimated (about 4 bytes a token) to exceed it ends before its model call, with the error
    /// `context_limit_exceeded`: nothing is spent, and the session stays usable (compact it, or
    /// start a new one).
    #[cfg_attr(feature = "schema", schema(minimum = 1, maximum = 10000000))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u32>,
}

/// The seed's assistant object. Its descriptive fields (`name`, `title`, `description`,
/// `created_at`) are accepted and kept with the turn; a field the seed does not define is refused
/// (a misspelt `instructions` or `enabled_tools` would otherwise change the turn silently).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Assistant {
    /// 1-256 characters (the seed's `asst_…`); when absent, `name` stands for it (one of the two
    /// is required).
    #[serde(default)]
    pub id: String,
    /// The seed's assistant name (kept with the turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The seed's display name (kept with the turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The seed's description, at most 4 KiB (kept with the turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The seed's creation time (RFC 3339), as an assistant object returned by the seed's API carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// The system prompt, at most 64 KiB.
    #[serde(default)]
    pub instructions: String,
    /// Every field optional: the fleet's defaults apply.
    #[serde(default, deserialize_with = "object")]
    pub model_config: ModelConfig,
    /// Names of the tools the model may call.
    #[serde(default)]
    pub enabled_tools: Vec<String>,
    /// Seed 002's output sink: the id of a registered webhook listing `output.delivery`, which
    /// receives the turn's final message as `{deliveryId, message}` and answers an `OutputReceipt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_sink: Option<String>,
}

/// A struct read from a JSON object only (serde would also read one from an array).
fn object<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<T, D::Error> {
    crate::retry_spec::ObjectOnly::<T>::deserialize(deserializer).map(|o| o.0)
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct InputMessage {
    /// `user`, `system` or `assistant`.
    pub role: String,
    pub content: String,
}

/// The body of `POST /v1/turns`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(as = TurnRequest))]
#[serde(deny_unknown_fields)]
pub struct TurnInput {
    /// 1-256 characters without control characters.
    pub session_id: String,
    #[serde(deserialize_with = "object")]
    pub assistant: Assistant,
    /// At least one message.
    pub messages: Vec<InputMessage>,
    /// `follow_up` (default): queue after the running turn; `steer`: join it.
    #[serde(default)]
    pub behavior: Behavior,
    /// Whose turn it is (1-64 of `A-Z a-z 0-9 . _ -`): a tenant-bound token's tenant (a different
    /// one is refused), else this, else the token's name (`token-` and 8 hex digits).
    #[serde(default)]
    pub tenant: Option<String>,
    /// `high`, `normal` (default) or `low`: the order of the tenant's own turns waiting for a
    /// provider's budget (it never moves a turn ahead of another tenant's).
    #[serde(default)]
    pub priority: Priority,
    /// A seed 001 agent's parts and entry step, set by the route that sends its input (never read
    /// from a body).
    #[serde(skip)]
    pub agent: Option<Box<crate::agent_config::AgentTurn>>,
}

impl TurnInput {
    /// What a silent `model_config` and a missing `id` stand for: the id is the seed's `name`,
    /// the provider and model are the fleet's defaults, the temperature is the seed's 0.7.
    pub fn apply_defaults(&mut self, default_provider: &str, default_model: &str) {
        let assistant = &mut self.assistant;
        if assistant.id.is_empty() {
            assistant.id = assistant.name.clone().unwrap_or_default();
        }
        let config = &mut assistant.model_config;
        config.provider.get_or_insert_with(|| default_provider.to_string());
        config.model.get_or_insert_with(|| default_model.to_string());
        config.temperature.get_or_insert(DEFAULT_TEMPERATURE);
    }

    /// The provider must be one the fleet is configured with (`known`), never a silent fallback.
    pub fn check_provider(&self, known: &[&str]) -> Result<(), String> {
        match self.assistant.model_config.provider.as_deref() {
            Some(p) if !known.contains(&p) => Err(format!(
                "assistant.model_config.provider {p:?} is not a configured provider (configured: {})",
                known.join(", ")
            )),
            _ => Ok(()),
        }
    }

    /// Content checks beyond the shape; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        let ident = |field: &str, v: &str| {
            if v.is_empty() || v.len() > 256 || v.chars().any(char::is_control) {
                Err(format!("{field} must be 1-256 characters without control characters"))
            } else {
                Ok(())
            }
        };
        ident("session_id", &self.session_id)?;
        if self.assistant.id.is_empty() && self.assistant.name.is_none() {
            return Err("assistant.id (or the seed's assistant.name) is required".into());
        }
        ident("assistant.id", &self.assistant.id)?;
        for (field, value) in [("assistant.name", &self.assistant.name), ("assistant.title", &self.assistant.title)] {
            if let Some(v) = value {
                ident(field, v)?;
            }
        }
        if self.assistant.description.as_ref().is_some_and(|d| d.len() > 4096) {
            return Err("assistant.description is longer than 4 KiB".into());
        }
        if self.assistant.created_at.as_deref().is_some_and(|t| crate::timefmt::millis_from_rfc3339(t).is_none()) {
            return Err("assistant.created_at must be an RFC 3339 time".into());
        }
        let config = &self.assistant.model_config;
        if let Some(provider) = &config.provider {
            ident("assistant.model_config.provider", provider)?;
        }
        if let Some(model) = &config.model {
            ident("assistant.model_config.model", model)?;
        }
        if let Some(t) = self.assistant.model_config.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err("assistant.model_config.temperature must be between 0 and 2".into());
            }
        }
        if let Some(n) = self.assistant.model_config.max_tokens {
            if !(1..=1_000_000).contains(&n) {
                return Err("assistant.model_config.max_tokens must be between 1 and 1000000".into());
            }
        }
        if let Some(n) = self.assistant.model_config.context_window {
            if !(1..=super::MAX_CONTEXT_WINDOW).contains(&n) {
                return Err("assistant.model_config.context_window must be between 1 and 10000000".into());
            }
        }
        if self.assistant.instructions.len() > 64 * 1024 {
            return Err("assistant.instructions is longer than 64 KiB".into());
        }
        for (i, t) in self.assistant.enabled_tools.iter().enumerate() {
            if !crate::tools::is_callable_tool_name(t) {
                return Err(format!("assistant.enabled_tools[{i}] is not a tool name"));
            }
        }
        if self.messages.is_empty() {
            return Err("messages must hold at least one message".into());
        }
        for (i, m) in self.messages.iter().enumerate() {
            if !matches!(m.role.as_str(), "user" | "system" | "assistant") {
                return Err(format!("messages[{i}].role must be user, system or assistant"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::TurnState;
    use serde_json::json;

    #[test]
    fn turn_input_is_validated_by_field() {
        let input: TurnInput = serde_json::from_value(json!({
            "session_id": "s1",
            "assistant": {"id": "a", "instructions": "be brief", "model_config": {"provider": "openai", "model": "m", "temperature": 0.2}, "enabled_tools": ["search"]},
            "messages": [{"role": "user", "content": "hi"}]
        }))
        .unwrap();
        assert_eq!(input.validate(), Ok(()));
        assert_eq!(input.behavior, Behavior::FollowUp);
        let state = TurnState::new(&input, "msg_1".into());
        assert_eq!(state.conversation[0].role, "system");
        assert!(state.enabled("search") && !state.enabled("other"));
        assert_eq!(input.assistant.model_config.model.as_deref(), Some("m"));
        let mut bad = input.clone();
        bad.assistant.model_config.temperature = Some(3.0);
        assert!(bad.validate().unwrap_err().contains("temperature"));
        let mut bad = input.clone();
        bad.messages.clear();
        assert!(bad.validate().unwrap_err().contains("messages"));
        let mut bad = input;
        bad.messages[0].role = "robot".into();
        assert!(bad.validate().unwrap_err().contains("messages[0].role"));
    }

    #[test]
    fn the_seeds_assistant_is_accepted_and_its_silences_get_defaults() {
        let mut input: TurnInput = serde_json::from_value(json!({
            "session_id": "s1",
            "assistant": {"name": "support_assistant", "title": "Support Assistant", "description": "Helps users",
                "created_at": "2026-01-20T12:00:00Z", "instructions": "be brief"},
            "messages": [{"role": "user", "content": "hi"}]
        }))
        .unwrap();
        input.apply_defaults("openai", "gpt-4o");
        assert_eq!(input.validate(), Ok(()));
        assert_eq!(input.assistant.id, "support_assistant", "the seed's name stands for a missing id");
        let config = &input.assistant.model_config;
        assert_eq!(config.provider.as_deref(), Some("openai"));
        assert_eq!(config.model.as_deref(), Some("gpt-4o"));
        assert_eq!(config.temperature, Some(DEFAULT_TEMPERATURE));
        assert_eq!(input.check_provider(&["openai"]), Ok(()));
        let stored = serde_json::to_value(TurnState::new(&input, "m".into())).unwrap();
        assert_eq!(stored["assistant"]["title"], "Support Assistant");

        let mut named = input.clone();
        named.assistant.model_config.provider = Some("other".into());
        let e = named.check_provider(&["openai", "b"]).unwrap_err();
        assert!(e.starts_with("assistant.model_config.provider"), "{e}");
        let unknown = serde_json::from_value::<TurnInput>(
            json!({"session_id": "s", "assistant": {"id": "a", "colour": "red"}, "messages": []}),
        );
        assert!(unknown.unwrap_err().to_string().contains("colour"), "a field the seed lacks is refused");
        let mut anonymous = input;
        anonymous.assistant.id.clear();
        anonymous.assistant.name = None;
        assert!(anonymous.validate().unwrap_err().contains("assistant.id"));
    }

    #[test]
    fn an_assistant_and_its_model_config_are_objects_not_arrays() {
        let as_array = json!({"session_id": "s", "assistant": {"id": "a", "model_config": ["openai"]}, "messages": []});
        let e = serde_json::from_value::<TurnInput>(as_array).unwrap_err().to_string();
        assert!(e.contains("expected an object") || e.contains("map"), "{e}");
        let assistant_array = json!({"session_id": "s", "assistant": ["a"], "messages": []});
        assert!(serde_json::from_value::<TurnInput>(assistant_array).is_err());
    }
}
