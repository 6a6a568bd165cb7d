//! Seed 000's own resources as plain data: assistants and rooms as stored, the checks their fields
//! pass (each error names the field), an update's merge, a message sent to a room, and the opaque
//! cursors of their listings. A room is a session (its id is the session id); a message to it is a
//! turn whose assistant is a copy of the room's assistant as it is when the message is sent.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use std::collections::BTreeMap;

use crate::agent_config::{AgentConfig, AgentStep, AgentTurn, Skill, ToolConfiguration, MAX_SECRET_BYTES};
use crate::timefmt::rfc3339_from_millis;
use crate::turn::{self, Behavior, ModelConfig};

/// The seed's temperature range for an assistant (`POST /v1/turns` takes up to 2).
pub const MAX_ASSISTANT_TEMPERATURE: f64 = 1.0;
/// An assistant's `name`: at most this many characters.
pub const MAX_NAME_LEN: usize = 64;
/// Tools one assistant may enable.
pub const MAX_ENABLED_TOOLS: usize = 128;
/// A room's `metadata`, as JSON, at most this many bytes.
pub const MAX_METADATA_BYTES: usize = 16 * 1024;
/// A listing's `limit`: default and maximum (the seed's message listing's, `history::page_limit`).
pub use crate::history::{DEFAULT_PAGE, MAX_PAGE};

/// A new assistant id: `asst_` and 32 random hex digits.
pub fn new_assistant_id() -> String {
    format!("asst_{}", uuid::Uuid::new_v4().simple())
}

/// A new room id: `room_` and 32 random hex digits.
pub fn new_room_id() -> String {
    format!("room_{}", uuid::Uuid::new_v4().simple())
}

pub use crate::ids::is_id;

/// An assistant as stored. `model_config` has the fleet's defaults filled in when it was created,
/// so what it shows is what its turns run with. `version` starts at 1 and grows with each update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantRecord {
    pub id: String,
    pub name: String,
    pub title: String,
    #[serde(default)]
    pub description: Option<String>,
    pub instructions: String,
    pub model_config: ModelConfig,
    #[serde(default)]
    pub enabled_tools: Vec<String>,
    pub version: u64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// The tenant whose bound token created it: only that tenant's tokens (and unbound ones) see
    /// it. `None`: an operator's (an unbound token's), which every tenant sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Seed 001's parts: steps, skills, tool configurations, secrets (sealed), output schemas.
    #[serde(default, skip_serializing_if = "AgentConfig::is_empty")]
    pub agent: AgentConfig,
}

impl AssistantRecord {
    /// Whether a caller bound to `bound` (`None`: unbound) sees this assistant.
    pub fn seen_by(&self, bound: Option<&str>) -> bool {
        bound.is_none() || self.tenant.is_none() || self.tenant.as_deref() == bound
    }
}

/// The field of the assistants' name index that holds `name`: names are unique per owner, a
/// tenant's (`TENANT|name`) or the operators' (the bare name, which no tenant's field can equal:
/// a name has no `|`).
pub fn name_key(tenant: Option<&str>, name: &str) -> String {
    match tenant {
        Some(t) => format!("{t}|{name}"),
        None => name.to_string(),
    }
}

/// An assistant to create (`name`, `title` and `instructions` required: `POST
/// /v1/agents/assistants`) or the fields of one to change (`PUT /v1/agents/assistants/{id}`: left
/// out or `null`: kept; `model_config`'s fields merge one by one, as in the seed's example).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AssistantInput {
    /// Unique per owner (a tenant's, or the operators'): a lowercase letter, then lowercase
    /// letters, digits or `_`, at most 64.
    #[cfg_attr(feature = "schema", schema(example = "support_assistant", pattern = "^[a-z][a-z0-9_]{0,63}$"))]
    #[serde(default)]
    pub name: Option<String>,
    /// 1-256 characters.
    #[cfg_attr(feature = "schema", schema(example = "Support Assistant", min_length = 1, max_length = 256))]
    #[serde(default)]
    pub title: Option<String>,
    /// At most 4096 characters.
    #[serde(default)]
    pub description: Option<String>,
    /// The system prompt, not blank, at most 64 KiB.
    #[cfg_attr(feature = "schema", schema(example = "You are a helpful support assistant."))]
    #[serde(default)]
    pub instructions: Option<String>,
    #[cfg_attr(feature = "schema", schema(schema_with = schema::assistant_model_config_or_null))]
    #[serde(default, deserialize_with = "object_only")]
    pub model_config: Option<ModelConfig>,
    /// Names of registered tools (at most 128, none twice); an unregistered one is a 422
    /// (`unknown_tool`) naming it.
    #[serde(default)]
    pub enabled_tools: Option<Vec<String>>,
    /// Seed 001's steps: name → the step's instructions, description, `next_steps` and
    /// `output_schema`. Given on an update: replaces them all.
    #[serde(default)]
    pub steps: Option<BTreeMap<String, AgentStep>>,
    /// The step a new session starts in (a key of `steps`; required with steps).
    #[serde(default)]
    pub first_step_name: Option<String>,
    /// Name → content an input `{"type": "skill", "skill_name"}` loads. Replaces them all.
    #[serde(default)]
    pub skills: Option<BTreeMap<String, Skill>>,
    /// Name → a configured use of a registered tool, with argument overrides (literals or
    /// `$ref`s to `secrets.`, `metadata.`, `tool_outputs.`). Replaces them all.
    #[serde(default)]
    pub tool_configurations: Option<BTreeMap<String, ToolConfiguration>>,
    /// Name → value (at most 4 KiB), stored encrypted and shown only as `****`; on an update each
    /// given name is set, and `null` removes it.
    #[serde(default)]
    pub secrets: Option<BTreeMap<String, Option<String>>>,
    /// Name → a JSON Schema (type `object`) that answers end with. Replaces them all.
    #[cfg_attr(feature = "schema", schema(value_type = Option<BTreeMap<String, Object>>))]
    #[serde(default)]
    pub output_schemas: Option<BTreeMap<String, Value>>,
    /// The output schema the agent's answers end with when their step names none.
    #[serde(default)]
    pub output_schema: Option<String>,
    /// The most step transitions one turn may make (1-100; default 100).
    #[cfg_attr(feature = "schema", schema(minimum = 1, maximum = 100))]
    #[serde(default)]
    pub transition_limit: Option<u32>,
    /// Replay the model's reasoning into later prompts (default false: reasoning is shown as
    /// `reasoning` events and never sent back to the model).
    #[serde(default)]
    pub replay_reasoning: Option<bool>,
    /// Seed 002's output sink: the id of a registered webhook listing `output.delivery`, which
    /// receives each turn's final message and answers an `OutputReceipt`.
    #[serde(default)]
    pub output_sink: Option<String>,
}

/// An assistant as the API shows it: the seed's assistant object, plus `version` and `updated_at`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(as = AgentAssistant))]
pub struct AssistantOut {
    /// `asst_` and 32 hex digits.
    pub id: String,
    pub name: String,
    pub title: String,
    pub description: Option<String>,
    pub instructions: String,
    /// With the defaults filled in: what its turns run with (`max_tokens` only when set).
    #[cfg_attr(feature = "schema", schema(schema_with = schema::assistant_model_config))]
    pub model_config: Map<String, Value>,
    pub enabled_tools: Vec<String>,
    /// 1 when created, one more with each update; a message's turn runs with the version current
    /// when it was sent.
    pub version: u64,
    /// RFC 3339.
    pub created_at: String,
    pub updated_at: String,
    /// Seed 001's parts, each secret's value shown as `****`.
    #[serde(flatten)]
    pub agent: AgentConfig,
}

/// The schemas of an assistant's `model_config`: a turn's, with the seed's temperature range.
#[cfg(feature = "schema")]
mod schema {
    use utoipa::openapi::schema::{Schema, SchemaType, Type};
    use utoipa::openapi::RefOr;

    /// An assistant's `model_config`: [`super::ModelConfig`]'s schema with temperature 0-1.
    pub(super) fn assistant_model_config() -> Schema {
        let mut schema = match <super::ModelConfig as utoipa::PartialSchema>::schema() {
            RefOr::T(schema) => schema,
            RefOr::Ref(_) => unreachable!("a derived struct schema is inline"),
        };
        if let Schema::Object(object) = &mut schema {
            object.description = Some(
                "The model an assistant's turns use; on create, a field left out takes the fleet's default.".into(),
            );
            if let Some(RefOr::T(Schema::Object(t))) = object.properties.get_mut("temperature") {
                t.maximum = Some(super::MAX_ASSISTANT_TEMPERATURE.into());
                t.description = Some("0-1 (the seed's range); default 0.7.".into());
            }
        }
        schema
    }

    /// The same, or `null` (an update that keeps it).
    pub(super) fn assistant_model_config_or_null() -> Schema {
        let mut schema = assistant_model_config();
        if let Schema::Object(object) = &mut schema {
            object.schema_type = SchemaType::from_iter([Type::Object, Type::Null]);
        }
        schema
    }
}

/// An optional struct read only from a JSON object (or `null`), never from an array of its fields.
fn object_only<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
    Option::<crate::retry_spec::ObjectOnly<T>>::deserialize(deserializer).map(|v| v.map(|o| o.0))
}

/// What a silent `model_config` field stands for when an assistant is created.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDefaults<'a> {
    pub provider: &'a str,
    pub model: &'a str,
}

impl AssistantInput {
    /// A new assistant from a create request; the error names the field.
    /// `seal` encrypts a secret's value (its name, the value) for the new assistant's id.
    pub fn create(
        self,
        id: String,
        defaults: &ModelDefaults<'_>,
        now_ms: i64,
        seal: &dyn Fn(&str, &str, &str) -> String,
    ) -> Result<AssistantRecord, String> {
        let mut agent = AgentConfig::default();
        self.apply_agent(&id, &mut agent, seal)?;
        let required = |v: Option<String>, field: &str| v.ok_or_else(|| format!("{field} is required"));
        let given = self.model_config.unwrap_or_default();
        let record = AssistantRecord {
            id,
            name: required(self.name, "name")?,
            title: required(self.title, "title")?,
            description: self.description,
            instructions: required(self.instructions, "instructions")?,
            model_config: ModelConfig {
                provider: Some(given.provider.unwrap_or_else(|| defaults.provider.to_string())),
                model: Some(given.model.unwrap_or_else(|| defaults.model.to_string())),
                temperature: Some(given.temperature.unwrap_or(turn::DEFAULT_TEMPERATURE)),
                max_tokens: given.max_tokens,
                context_window: given.context_window,
            },
            enabled_tools: self.enabled_tools.unwrap_or_default(),
            version: 1,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            tenant: None,
            agent,
        };
        check_assistant(&record)?;
        Ok(record)
    }

    /// `current` with this update's fields applied, as the next version; the error names the field.
    pub fn apply(
        self,
        current: &AssistantRecord,
        now_ms: i64,
        seal: &dyn Fn(&str, &str, &str) -> String,
    ) -> Result<AssistantRecord, String> {
        let mut next = current.clone();
        self.apply_agent(&current.id, &mut next.agent, seal)?;
        if let Some(name) = self.name {
            next.name = name;
        }
        if let Some(title) = self.title {
            next.title = title;
        }
        if let Some(description) = self.description {
            next.description = Some(description);
        }
        if let Some(instructions) = self.instructions {
            next.instructions = instructions;
        }
        if let Some(given) = self.model_config {
            let config = &mut next.model_config;
            config.provider = given.provider.or(config.provider.take());
            config.model = given.model.or(config.model.take());
            config.temperature = given.temperature.or(config.temperature);
            config.max_tokens = given.max_tokens.or(config.max_tokens);
            config.context_window = given.context_window.or(config.context_window);
        }
        if let Some(tools) = self.enabled_tools {
            next.enabled_tools = tools;
        }
        next.version = current.version + 1;
        next.updated_at_ms = now_ms.max(current.updated_at_ms);
        check_assistant(&next)?;
        Ok(next)
    }

    /// This request's seed 001 parts applied to `agent` (of assistant `id`), each secret sealed
    /// (`seal(id, name, value)`): the plain value never reaches the record.
    fn apply_agent(
        &self,
        id: &str,
        agent: &mut AgentConfig,
        seal: &dyn Fn(&str, &str, &str) -> String,
    ) -> Result<(), String> {
        macro_rules! replace {
            ($($field:ident),*) => {$(
                if let Some(v) = &self.$field {
                    agent.$field = v.clone();
                }
            )*};
        }
        replace!(steps, skills, tool_configurations, output_schemas);
        macro_rules! set {
            ($($field:ident),*) => {$(
                if self.$field.is_some() {
                    agent.$field = self.$field.clone();
                }
            )*};
        }
        set!(first_step_name, output_schema, transition_limit, output_sink);
        if let Some(replay) = self.replay_reasoning {
            agent.replay_reasoning = replay;
        }
        for (name, value) in self.secrets.iter().flatten() {
            crate::agent_config::check_name("secrets key", name)?;
            match value {
                None => {
                    agent.secrets.remove(name);
                }
                Some(v) if v.is_empty() || v.len() > MAX_SECRET_BYTES => {
                    return Err(format!("secrets.{name} must be 1 byte to 4 KiB"));
                }
                Some(v) => {
                    agent.secrets.insert(name.clone(), seal(id, name, v));
                }
            }
        }
        Ok(())
    }
}

/// An identifier-like text field: 1-`max` characters, no control characters.
fn text(field: &str, value: &str, max: usize) -> Result<(), String> {
    if value.is_empty() || value.chars().count() > max || value.chars().any(char::is_control) {
        return Err(format!("{field} must be 1-{max} characters without control characters"));
    }
    Ok(())
}

/// The seed's assistant `name` ("lowercase, underscores only"): a lowercase letter, then lowercase
/// letters, digits and underscores, at most 64 in all.
pub fn check_assistant_name(name: &str) -> Result<(), String> {
    let mut bytes = name.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_lowercase());
    if !first_ok
        || name.len() > MAX_NAME_LEN
        || !bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(format!(
            "name must be 1-{MAX_NAME_LEN} lowercase letters, digits or underscores, starting with a letter \
             (e.g. \"support_assistant\")"
        ));
    }
    Ok(())
}

/// Every field of an assistant (`enabled_tools` for their shape; whether they are registered is
/// the caller's to check).
pub fn check_assistant(a: &AssistantRecord) -> Result<(), String> {
    check_assistant_name(&a.name)?;
    text("title", &a.title, 256)?;
    if a.description.as_ref().is_some_and(|d| d.chars().count() > 4096) {
        return Err("description is longer than 4096 characters".into());
    }
    if a.instructions.trim().is_empty() {
        return Err("instructions must not be empty".into());
    }
    if a.instructions.len() > 64 * 1024 {
        return Err("instructions is longer than 64 KiB".into());
    }
    let config = &a.model_config;
    if let Some(provider) = &config.provider {
        text("model_config.provider", provider, 256)?;
    }
    if let Some(model) = &config.model {
        text("model_config.model", model, 256)?;
    }
    if let Some(t) = config.temperature {
        if !(0.0..=MAX_ASSISTANT_TEMPERATURE).contains(&t) {
            return Err("model_config.temperature must be between 0 and 1".into());
        }
    }
    if let Some(n) = config.max_tokens {
        if !(1..=1_000_000).contains(&n) {
            return Err("model_config.max_tokens must be between 1 and 1000000".into());
        }
    }
    if let Some(n) = config.context_window {
        if !(1..=turn::MAX_CONTEXT_WINDOW).contains(&n) {
            return Err("model_config.context_window must be between 1 and 10000000".into());
        }
    }
    if a.enabled_tools.len() > MAX_ENABLED_TOOLS {
        return Err(format!("enabled_tools names more than {MAX_ENABLED_TOOLS} tools"));
    }
    for (i, t) in a.enabled_tools.iter().enumerate() {
        if !crate::tools::is_callable_tool_name(t) {
            return Err(format!("enabled_tools[{i}] is not a tool name"));
        }
        if a.enabled_tools[..i].contains(t) {
            return Err(format!("enabled_tools[{i}] names {t:?} twice"));
        }
    }
    a.agent.check(&a.enabled_tools)
}

impl AssistantRecord {
    /// The seed's assistant object, plus `version` and `updated_at` (`model_config.max_tokens`
    /// only when set).
    pub fn to_api(&self) -> AssistantOut {
        let mut model_config = match json!(self.model_config) {
            Value::Object(config) => config,
            _ => Map::new(),
        };
        model_config.retain(|_, v| !v.is_null());
        AssistantOut {
            id: self.id.clone(),
            name: self.name.clone(),
            title: self.title.clone(),
            description: self.description.clone(),
            instructions: self.instructions.clone(),
            model_config,
            enabled_tools: self.enabled_tools.clone(),
            version: self.version,
            created_at: rfc3339_from_millis(self.created_at_ms),
            updated_at: rfc3339_from_millis(self.updated_at_ms),
            agent: self.agent.masked(),
        }
    }

    /// The seed 001 parts a turn of this agent carries (none for an assistant without them),
    /// entering `entry_step` first if given.
    pub fn agent_turn(&self, entry_step: Option<String>) -> Option<Box<AgentTurn>> {
        (!self.agent.is_empty() || entry_step.is_some())
            .then(|| Box::new(AgentTurn { config: self.agent.clone(), entry_step, ..Default::default() }))
    }

    /// The copy a turn runs with: taken when a message is sent, so an update made while the turn
    /// waits or runs changes only later messages' turns.
    pub fn snapshot(&self) -> turn::Assistant {
        turn::Assistant {
            id: self.id.clone(),
            name: Some(self.name.clone()),
            title: Some(self.title.clone()),
            description: self.description.clone(),
            created_at: Some(rfc3339_from_millis(self.created_at_ms)),
            instructions: self.instructions.clone(),
            model_config: self.model_config.clone(),
            enabled_tools: self.enabled_tools.clone(),
            output_sink: self.agent.output_sink.clone(),
        }
    }
}

// ---- rooms ----

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RoomStatus {
    Active,
    Closed,
}

impl RoomStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RoomStatus::Active => "active",
            RoomStatus::Closed => "closed",
        }
    }

    pub fn parse(s: &str) -> Option<RoomStatus> {
        match s {
            "active" => Some(RoomStatus::Active),
            "closed" => Some(RoomStatus::Closed),
            _ => None,
        }
    }
}

/// A room as stored. Its id is its session's id: its stream, history and turns are the session's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoomRecord {
    pub id: String,
    pub assistant_id: String,
    #[serde(default)]
    pub namespace: Option<String>,
    pub status: RoomStatus,
    #[serde(default)]
    pub metadata: Map<String, Value>,
    pub created_at_ms: i64,
    #[serde(default)]
    pub closed_at_ms: Option<i64>,
}

/// A room to create: both fields optional (the body of `POST /v1/agents/{assistant_id}/rooms`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RoomInput {
    /// Whose room it is (e.g. `user_123`): 1-256 characters; rooms are listed by it.
    #[cfg_attr(feature = "schema", schema(example = "user_123"))]
    #[serde(default)]
    pub namespace: Option<String>,
    /// Any JSON object, at most 16 KiB as JSON.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

impl RoomInput {
    pub fn create(self, id: String, assistant_id: &str, now_ms: i64) -> Result<RoomRecord, String> {
        if let Some(ns) = &self.namespace {
            text("namespace", ns, 256)?;
        }
        let metadata = self.metadata.unwrap_or_default();
        if serde_json::to_vec(&metadata).map_or(0, |v| v.len()) > MAX_METADATA_BYTES {
            return Err(format!("metadata is larger than {} KiB as JSON", MAX_METADATA_BYTES / 1024));
        }
        Ok(RoomRecord {
            id,
            assistant_id: assistant_id.to_string(),
            namespace: self.namespace,
            status: RoomStatus::Active,
            metadata,
            created_at_ms: now_ms,
            closed_at_ms: None,
        })
    }
}

/// A room as the API shows it (the seed's room object).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(as = Room))]
pub struct RoomOut {
    /// `room_` and 32 hex digits; also the room's session id (`/v1/sessions/{id}/…`).
    pub id: String,
    pub assistant_id: String,
    pub namespace: Option<String>,
    pub status: RoomStatus,
    pub metadata: Map<String, Value>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339; null while active.
    pub closed_at: Option<String>,
    /// Messages in the room (a single room's answer only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_count: Option<u64>,
    /// RFC 3339, the newest message's; null before the first (a single room's answer only).
    #[cfg_attr(feature = "schema", schema(value_type = Option<String>))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_message_at: Option<Option<String>>,
}

impl RoomRecord {
    /// The seed's room object; `message_count` and `last_message_at` when known (a single room).
    pub fn to_api(&self, messages: Option<(u64, Option<&str>)>) -> RoomOut {
        RoomOut {
            id: self.id.clone(),
            assistant_id: self.assistant_id.clone(),
            namespace: self.namespace.clone(),
            status: self.status,
            metadata: self.metadata.clone(),
            created_at: rfc3339_from_millis(self.created_at_ms),
            closed_at: self.closed_at_ms.map(rfc3339_from_millis),
            message_count: messages.map(|(count, _)| count),
            last_message_at: messages.map(|(_, last)| last.map(str::to_string)),
        }
    }

    /// This room closed at `now_ms` (a closed room stays as it was).
    pub fn closed(&self, now_ms: i64) -> RoomRecord {
        let mut next = self.clone();
        if next.status == RoomStatus::Active {
            next.status = RoomStatus::Closed;
            next.closed_at_ms = Some(now_ms);
        }
        next
    }
}

/// `GET /v1/agents/rooms`'s filters; each one given narrows the listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoomFilter {
    pub namespace: Option<String>,
    pub assistant_id: Option<String>,
    pub status: Option<RoomStatus>,
}

impl RoomFilter {
    pub fn parse(namespace: Option<&str>, assistant_id: Option<&str>, status: Option<&str>) -> Result<Self, String> {
        if let Some(ns) = namespace {
            text("namespace", ns, 256)?;
        }
        if let Some(a) = assistant_id {
            text("assistant_id", a, 256)?;
        }
        let status = match status {
            None => None,
            Some(s) => Some(RoomStatus::parse(s).ok_or("status must be active or closed")?),
        };
        Ok(RoomFilter {
            namespace: namespace.map(str::to_string),
            assistant_id: assistant_id.map(str::to_string),
            status,
        })
    }

    pub fn matches(&self, room: &RoomRecord) -> bool {
        self.namespace.as_ref().is_none_or(|ns| room.namespace.as_ref() == Some(ns))
            && self.assistant_id.as_ref().is_none_or(|a| &room.assistant_id == a)
            && self.status.is_none_or(|s| room.status == s)
    }
}

// ---- listings ----

/// A registry listing's order key: creation time, then id, as one string that sorts as they do
/// (sorted-set members of equal score sort by their bytes).
pub fn index_member(created_at_ms: i64, id: &str) -> String {
    format!("{:016}:{id}", created_at_ms.max(0))
}

/// A listing request (`limit`, `cursor`), checked: the error names the parameter. Listings run
/// newest first; the cursor is the order key of the last entry a page returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListRequest {
    pub limit: usize,
    pub after: Option<String>,
}

impl ListRequest {
    pub fn parse(limit: Option<&str>, cursor: Option<&str>) -> Result<Self, String> {
        let limit = crate::history::page_limit(limit)?;
        let after = match cursor {
            None | Some("") => None,
            Some(c) => Some(decode_cursor(c).ok_or("cursor is not a next_cursor this listing returned")?),
        };
        Ok(ListRequest { limit, after })
    }
}

pub fn encode_cursor(member: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json!({ "k": member }).to_string())
}

pub fn decode_cursor(cursor: &str) -> Option<String> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(cursor).ok()?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    let member = v["k"].as_str()?;
    let (ms, _) = member.split_once(':')?;
    (ms.len() == 16 && ms.bytes().all(|b| b.is_ascii_digit())).then(|| member.to_string())
}

// ---- messages ----

/// A user's message to a room (the body of `POST /v1/agents/rooms/{room_id}/messages`): the
/// seed's `content` and `role`, and the fleet's `behavior` for a message sent while a turn runs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MessageInput {
    /// Not empty.
    #[cfg_attr(feature = "schema", schema(example = "How do I update my billing information?", min_length = 1))]
    pub content: String,
    /// `user` (the default): the other roles are the assistant's and its tools' to make.
    #[cfg_attr(feature = "schema", schema(value_type = Option<UserRole>))]
    #[serde(default)]
    pub role: Option<String>,
    /// While a turn runs in the room: `follow_up` (default) runs after it, `steer` joins it.
    #[cfg_attr(feature = "schema", schema(value_type = Option<Behavior>))]
    #[serde(default)]
    pub behavior: Behavior,
}

/// The one role a client sends (its schema: the API refuses the others).
#[cfg(feature = "schema")]
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
enum UserRole {
    User,
}

impl MessageInput {
    pub fn check(&self) -> Result<(), String> {
        match self.role.as_deref() {
            None | Some("user") => {}
            Some(other) => {
                return Err(format!(
                    "role must be \"user\" ({other:?} messages are the assistant's and its tools' to make)"
                ))
            }
        }
        if self.content.is_empty() {
            return Err("content must not be empty".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULTS: ModelDefaults<'static> = ModelDefaults { provider: "openai", model: "gpt-4o" };

    fn input(v: Value) -> AssistantInput {
        serde_json::from_value(v).unwrap()
    }

    fn seal(_: &str, _: &str, v: &str) -> String {
        format!("sealed:{v}")
    }

    fn quick_start() -> AssistantRecord {
        input(json!({"name": "helper", "title": "Helper", "instructions": "You are a helpful assistant."}))
            .create(new_assistant_id(), &DEFAULTS, 1_000, &seal)
            .unwrap()
    }

    #[test]
    fn a_tenants_assistant_is_seen_by_it_and_unbound_callers_an_operators_by_all() {
        let mut a = quick_start();
        assert!(a.seen_by(None) && a.seen_by(Some("acme")));
        a.tenant = Some("acme".into());
        assert!(a.seen_by(None) && a.seen_by(Some("acme")) && !a.seen_by(Some("beta")));
        assert_eq!(name_key(Some("acme"), "helper"), "acme|helper");
        assert_eq!(name_key(None, "helper"), "helper");
        let stored = serde_json::to_value(quick_start()).unwrap();
        assert!(stored.get("tenant").is_none(), "an operator's is stored as before: {stored}");
    }

    #[test]
    fn a_new_assistant_gets_the_seeds_defaults() {
        let a = quick_start();
        assert!(is_id("asst_", &a.id), "{}", a.id);
        assert_eq!(a.model_config.provider.as_deref(), Some("openai"));
        assert_eq!(a.model_config.model.as_deref(), Some("gpt-4o"));
        assert_eq!(a.model_config.temperature, Some(0.7));
        assert_eq!(a.model_config.max_tokens, None);
        assert_eq!((a.version, a.created_at_ms, a.updated_at_ms), (1, 1_000, 1_000));
        let api = json!(a.to_api());
        assert_eq!(api["created_at"], "1970-01-01T00:00:01.000Z");
        assert_eq!(api["enabled_tools"], json!([]));
        assert_eq!(api["description"], Value::Null);
        assert_eq!(api["model_config"], json!({"provider": "openai", "model": "gpt-4o", "temperature": 0.7}));
    }

    #[test]
    fn required_fields_are_named() {
        for (body, field) in [
            (json!({"title": "T", "instructions": "i"}), "name"),
            (json!({"name": "n", "instructions": "i"}), "title"),
            (json!({"name": "n", "title": "T"}), "instructions"),
        ] {
            let e = input(body).create(new_assistant_id(), &DEFAULTS, 0, &seal).unwrap_err();
            assert!(e.starts_with(field), "{e}");
        }
        assert!(serde_json::from_value::<AssistantInput>(json!({"nmae": "x"})).is_err(), "unknown fields are refused");
    }

    #[test]
    fn names_are_lowercase_letters_digits_and_underscores() {
        for good in ["helper", "support_assistant", "bot2", "a"] {
            assert!(check_assistant_name(good).is_ok(), "{good}");
        }
        for bad in ["", "Helper", "support-assistant", "2bot", "_x", "has space", &"a".repeat(65), "café"] {
            assert!(check_assistant_name(bad).unwrap_err().starts_with("name"), "{bad}");
        }
    }

    #[test]
    fn fields_are_checked_by_name() {
        let base = json!({"name": "n", "title": "T", "instructions": "i"});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            input(b).create(new_assistant_id(), &DEFAULTS, 0, &seal)
        };
        assert!(with("model_config", json!({"temperature": 1.5})).unwrap_err().contains("temperature"));
        assert!(with("model_config", json!({"temperature": 1.0})).is_ok());
        assert!(with("model_config", json!({"max_tokens": 0})).unwrap_err().contains("max_tokens"));
        assert!(with("instructions", json!("  ")).unwrap_err().contains("instructions"));
        assert!(with("title", json!("")).unwrap_err().contains("title"));
        assert!(with("enabled_tools", json!(["a b"])).unwrap_err().contains("enabled_tools[0]"));
        assert!(with("enabled_tools", json!(["a", "a"])).unwrap_err().contains("twice"));
        assert!(serde_json::from_value::<AssistantInput>(json!({"model_config": {"temprature": 1}})).is_err());
        assert!(serde_json::from_value::<AssistantInput>(json!({"model_config": [null, null]})).is_err());
        assert!(serde_json::from_value::<AssistantInput>(json!({"model_config": null}))
            .unwrap()
            .model_config
            .is_none());
    }

    #[test]
    fn an_update_merges_as_the_seeds_example_does() {
        let a = quick_start();
        let b = input(
            json!({"instructions": "Updated instructions with more detail...", "model_config": {"temperature": 0.5}}),
        )
        .apply(&a, 2_000, &seal)
        .unwrap();
        assert_eq!(b.instructions, "Updated instructions with more detail...");
        assert_eq!(b.model_config.temperature, Some(0.5));
        assert_eq!(b.model_config.model.as_deref(), Some("gpt-4o"), "a field left out keeps its value");
        assert_eq!((b.name.as_str(), b.title.as_str()), ("helper", "Helper"));
        assert_eq!((b.version, b.created_at_ms, b.updated_at_ms), (2, 1_000, 2_000));
        assert!(input(json!({"name": "Bad"})).apply(&a, 3_000, &seal).is_err());
    }

    #[test]
    fn a_snapshot_is_the_turns_assistant() {
        let a = quick_start();
        let s = a.snapshot();
        assert_eq!((s.id.as_str(), s.name.as_deref()), (a.id.as_str(), Some("helper")));
        assert_eq!(s.instructions, a.instructions);
        assert_eq!(s.model_config, a.model_config);
    }

    #[test]
    fn rooms_are_created_active_and_close_once() {
        let input: RoomInput =
            serde_json::from_value(json!({"namespace": "user_123", "metadata": {"plan": "premium"}})).unwrap();
        let room = input.create(new_room_id(), "asst_x", 5).unwrap();
        assert!(is_id("room_", &room.id));
        assert_eq!(room.status, RoomStatus::Active);
        let closed = room.closed(9);
        assert_eq!((closed.status, closed.closed_at_ms), (RoomStatus::Closed, Some(9)));
        assert_eq!(closed.closed(12), closed, "closing again changes nothing");
        let api = json!(closed.to_api(Some((5, Some("2026-01-20T12:05:00Z")))));
        assert_eq!(api["message_count"], 5);
        assert_eq!(api["metadata"]["plan"], "premium");
        assert!(json!(room.to_api(None)).get("message_count").is_none());
        let empty = json!(room.to_api(Some((0, None))));
        assert!(empty.as_object().unwrap().contains_key("last_message_at") && empty["last_message_at"].is_null());
        assert!(json!(room.to_api(None)).get("last_message_at").is_none());
        let big: RoomInput =
            serde_json::from_value(json!({"metadata": {"x": "y".repeat(MAX_METADATA_BYTES)}})).unwrap();
        assert!(big.create(new_room_id(), "asst_x", 0).unwrap_err().starts_with("metadata"));
        assert!(serde_json::from_value::<RoomInput>(json!({"metadata": []})).is_err());
    }

    #[test]
    fn room_filters_parse_and_match() {
        let room =
            RoomInput { namespace: Some("u1".into()), metadata: None }.create(new_room_id(), "asst_a", 0).unwrap();
        let f = RoomFilter::parse(Some("u1"), None, Some("active")).unwrap();
        assert!(f.matches(&room));
        assert!(!f.matches(&room.closed(1)));
        assert!(!RoomFilter::parse(None, Some("asst_b"), None).unwrap().matches(&room));
        assert!(RoomFilter::parse(None, None, Some("open")).unwrap_err().contains("status"));
    }

    #[test]
    fn cursors_round_trip_and_bad_ones_are_named() {
        let member = index_member(1_737_374_400_000, "room_abc");
        assert_eq!(member, "0001737374400000:room_abc");
        assert!(index_member(1, "b") > index_member(0, "z"), "time first");
        let req = ListRequest::parse(Some("2"), Some(&encode_cursor(&member))).unwrap();
        assert_eq!(req, ListRequest { limit: 2, after: Some(member) });
        assert!(ListRequest::parse(None, Some("nonsense")).unwrap_err().contains("cursor"));
        assert!(ListRequest::parse(Some("101"), None).unwrap_err().contains("limit"));
        assert_eq!(ListRequest::parse(None, None).unwrap().limit, 50);
    }

    #[test]
    fn a_message_is_the_users() {
        let m = |v: Value| serde_json::from_value::<MessageInput>(v).unwrap();
        assert!(m(json!({"content": "Hello!", "role": "user"})).check().is_ok());
        assert!(m(json!({"content": "Hello!"})).check().is_ok());
        assert!(m(json!({"content": "x", "role": "assistant"})).check().unwrap_err().starts_with("role"));
        assert!(m(json!({"content": ""})).check().unwrap_err().starts_with("content"));
        assert_eq!(m(json!({"content": "x", "behavior": "steer"})).behavior, Behavior::Steer);
    }
}
