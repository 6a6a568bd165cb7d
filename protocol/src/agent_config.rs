//! Seed 001's agent beyond a seed 000 assistant, as plain data: steps and their handoffs, skills,
//! tool configurations with argument overrides, secrets (stored sealed), output schemas and the
//! transition limit; the checks each passes (the error names the field), and the system prompt
//! and transition tool a step gives the model.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::schema::ToolSchema;

/// The tool the model moves between steps with. Offered only in a step that names `next_steps`;
/// no tool configuration or enabled tool of a stepped agent may take its name.
pub const TRANSITION_TOOL: &str = "transition_to_step";
/// Steps, skills, tool configurations, secrets or output schemas one agent may have, each.
pub const MAX_PARTS: usize = 64;
/// A step's instructions or a skill's content, at most this many bytes.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// A secret's value, at most this many bytes.
pub const MAX_SECRET_BYTES: usize = 4 * 1024;
/// An output schema, as JSON, at most this many bytes.
pub const MAX_SCHEMA_BYTES: usize = 32 * 1024;
/// The most step transitions a `transition_limit` may allow (and the limit when none is set).
pub const MAX_TRANSITIONS: u32 = 100;
/// What a secret's value shows as wherever the agent is shown.
pub const MASK: &str = "****";

/// The seed 001 parts of an agent as stored (secrets sealed), as a running turn carries them,
/// and, `masked`, as the API shows them (only those it has).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "schema",
    schema(description = "An agent's seed 001 parts (only those it has); each secret's value shows as `****`.")
)]
pub struct AgentConfig {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub steps: BTreeMap<String, AgentStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_step_name: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub skills: BTreeMap<String, Skill>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_configurations: BTreeMap<String, ToolConfiguration>,
    /// Name → the value sealed with `FLEET_SECRETS_KEY` (`secrets::SecretsKey`, owner
    /// `secret_owner`): never the value itself. The API shows each as `****`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, String>,
    #[cfg_attr(feature = "schema", schema(value_type = BTreeMap<String, Object>))]
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub output_schemas: BTreeMap<String, Value>,
    /// The output schema the agent's answers end with, when its step names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transition_limit: Option<u32>,
    /// Replay the model's reasoning into later prompts (as each answer's `reasoning_content`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replay_reasoning: bool,
    /// Seed 002's output sink: the id of a webhook listing `output.delivery`, which receives each
    /// turn's final message as `{deliveryId, message}` and answers an `OutputReceipt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_sink: Option<String>,
}

/// One step of an agent: what the model is told in it and where it may hand off to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AgentStep {
    /// Told to the model after the agent's instructions while the session is in this step
    /// (1 byte to 64 KiB).
    pub instructions: String,
    /// What the step is for: shown to the model in the steps that may hand off to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The steps the model may hand off to from here (with the `transition_to_step` tool); none:
    /// the step is final.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub next_steps: Vec<String>,
    /// The output schema (a key of `output_schemas`) answers in this step end with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<String>,
}

/// Content an input of `{"type": "skill", "skill_name"}` loads into the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Skill {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// 1 byte to 64 KiB.
    pub content: String,
}

/// One configured use of a registered tool: the model calls it by the configuration's name, and
/// the overrides fill arguments the model neither sees nor chooses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ToolConfiguration {
    /// A registered tool.
    pub tool_name: String,
    /// Told to the model instead of the tool's own description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Dot-notation leaf path (`api_key`, `config.auth.token`, `items[0]`) → a literal, or
    /// `{"$ref": "secrets.NAME" | "metadata.KEY[.path]" | "tool_outputs.CONFIGURATION[.path]"}`
    /// resolved against the session at each launch.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    #[cfg_attr(feature = "schema", schema(value_type = Object))]
    pub argument_overrides: Map<String, Value>,
    /// What its calls do (seed 002's `effects`), beside its tool's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub effects: Vec<crate::approval_policy::Effect>,
    /// Each call waits for an operator's decision, even if its tool does not ask for one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requires_approval: bool,
    /// How long a call waits for its decision (else its tool's, else 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_timeout_secs: Option<u64>,
    /// What a call becomes when nobody decided in time (else its tool's, else `deny`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_timeout_outcome: Option<crate::approval_policy::TimeoutOutcome>,
}

/// A seed 001 agent's turn: the agent's parts as the turn started (a later version of the agent
/// changes only later turns), the step the input asked to enter, and where the turn stands.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentTurn {
    pub config: AgentConfig,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry_step: Option<String>,
    /// The step the turn is in; known once its first step read the session's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(default)]
    pub step_known: bool,
    /// Step transitions the turn made.
    #[serde(default)]
    pub transitions: u32,
    /// Events the turn's end sends before its answer's (`structured_output`, or why it could not).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub closing: Vec<Value>,
}

impl AgentTurn {
    /// Enters the turn's first step (the input's `entry_step`, else the session's `session_step`,
    /// else the agent's first), once; the system prompt then tells it. Returns whether it did.
    pub fn enter(&mut self, session_step: Option<&str>) -> bool {
        if self.step_known {
            return false;
        }
        self.step_known = true;
        self.step = self.config.starting_step(self.entry_step.as_deref(), session_step);
        true
    }
}

/// What a `$ref` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reference {
    /// One of the agent's secrets.
    Secret(String),
    /// The session's metadata (a room's), then a path in it.
    Metadata(String, String),
    /// The newest output of a tool configuration in the session, then a path in it.
    ToolOutput(String, String),
}

impl Reference {
    /// Reads `{"$ref": "…"}`; `Ok(None)` for a literal.
    pub fn of(value: &Value) -> Result<Option<Reference>, String> {
        let Some(text) = value.as_object().filter(|o| o.len() == 1).and_then(|o| o.get("$ref")) else {
            return Ok(None);
        };
        let text = text.as_str().ok_or("a $ref must be a string")?;
        let (root, rest) = text.split_once('.').ok_or_else(|| format!("$ref {text:?} names no field"))?;
        let (name, path) = rest.split_once('.').map_or((rest, ""), |(n, p)| (n, p));
        if name.is_empty() {
            return Err(format!("$ref {text:?} names no field"));
        }
        match root {
            "secrets" if path.is_empty() => Ok(Some(Reference::Secret(name.into()))),
            "secrets" => Err(format!("$ref {text:?}: a secret is a whole value (secrets.NAME)")),
            "metadata" => Ok(Some(Reference::Metadata(name.into(), path.into()))),
            "tool_outputs" => Ok(Some(Reference::ToolOutput(name.into(), path.into()))),
            _ => Err(format!("$ref {text:?} must start with secrets., metadata. or tool_outputs.")),
        }
    }
}

/// What a tool configuration's overrides give one call, resolved against the session.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// Path → value, as the tool receives them.
    pub values: Vec<(String, Value)>,
    /// Path → value as events show them: a secret's `****`.
    pub shown: Map<String, Value>,
    /// The secrets' values, for scrubbing anything that echoes them.
    pub secrets: Vec<String>,
    /// The paths whose values are secrets.
    pub secret_paths: Vec<String>,
}

/// The key of an object standing for a sealed value (`{"$sealed": "v1.…"}`) in what the fleet
/// keeps: a client tool's arguments hold secrets only so, until they are shown to the client.
pub const SEALED: &str = "$sealed";

/// Replaces every `{"$sealed": …}` in `value` with what `open` makes of it (`null` if it cannot).
pub fn unseal(value: &mut Value, open: &dyn Fn(&str) -> Option<String>) {
    match value {
        Value::Object(map) if map.len() == 1 && map.get(SEALED).is_some_and(Value::is_string) => {
            let opened = map[SEALED].as_str().and_then(open);
            *value = opened.map_or(Value::Null, Value::String);
        }
        Value::Object(map) => map.values_mut().for_each(|v| unseal(v, open)),
        Value::Array(items) => items.iter_mut().for_each(|v| unseal(v, open)),
        _ => {}
    }
}

impl Overrides {
    /// The model's `arguments` with the overrides laid over them at their paths.
    pub fn apply(&self, arguments: &Value) -> Value {
        let mut merged = if arguments.is_object() { arguments.clone() } else { json!({}) };
        for (path, value) in &self.values {
            write_path(&mut merged, path, value.clone());
        }
        merged
    }

    /// The same, each secret sealed by `seal` (`{"$sealed": …}`): what a client tool's pending
    /// call keeps, opened only as it is shown to the client.
    pub fn apply_sealed(&self, arguments: &Value, seal: &dyn Fn(&str) -> String) -> Value {
        let mut merged = self.apply(arguments);
        for path in &self.secret_paths {
            if let Some(plain) = read_path(&merged, path).and_then(Value::as_str).map(str::to_string) {
                write_path(&mut merged, path, json!({SEALED: seal(&plain)}));
            }
        }
        merged
    }
}

impl ToolConfiguration {
    /// Its approval settings, laid over its tool's by `approvals::needs_approval`.
    pub fn approval_settings(&self) -> crate::approval_policy::ApprovalSettings {
        crate::approval_policy::ApprovalSettings {
            effects: self.effects.clone(),
            requires_approval: self.requires_approval,
            approval_timeout_secs: self.approval_timeout_secs,
            approval_timeout_outcome: self.approval_timeout_outcome,
        }
    }

    /// The paths the overrides fill (what `tool_input` events freeze).
    pub fn override_paths(&self) -> Vec<String> {
        self.argument_overrides.keys().cloned().collect()
    }

    /// Resolves every override: literals as they are, each `$ref` by `lookup` (whose error names
    /// what is missing); the first unresolved one is the error.
    pub fn resolve(&self, lookup: &dyn Fn(&Reference) -> Result<Value, String>) -> Result<Overrides, String> {
        let mut resolved = Overrides::default();
        for (path, value) in &self.argument_overrides {
            let (value, shown) = match Reference::of(value)? {
                None => (value.clone(), value.clone()),
                Some(reference) => {
                    let found = lookup(&reference).map_err(|e| format!("argument override {path:?}: {e}"))?;
                    match reference {
                        Reference::Secret(_) => {
                            resolved.secrets.extend(found.as_str().map(str::to_string));
                            resolved.secret_paths.push(path.clone());
                            (found, json!(MASK))
                        }
                        _ => (found.clone(), found),
                    }
                }
            };
            resolved.values.push((path.clone(), value));
            resolved.shown.insert(path.clone(), shown);
        }
        Ok(resolved)
    }
}

/// The owner a secret of `agent_id` is sealed for: a sealed value copied to another agent or
/// name does not open.
pub fn secret_owner(agent_id: &str, name: &str) -> String {
    format!("{agent_id}/secrets/{name}")
}

/// A step, skill, tool configuration, secret or schema name: 1-64 of `A-Z a-z 0-9 _ -`.
pub fn check_name(field: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!("{field} {name:?} must be 1-64 letters, digits, '_' or '-'"));
    }
    Ok(())
}

fn bounded_text(field: &str, text: &str) -> Result<(), String> {
    if text.trim().is_empty() || text.len() > MAX_TEXT_BYTES {
        return Err(format!("{field} must be 1 byte to 64 KiB and not blank"));
    }
    Ok(())
}

/// A dot-notation leaf path: names separated by `.`, each optionally indexed (`items[0]`).
pub fn parse_path(path: &str) -> Option<Vec<PathPart>> {
    let mut parts = Vec::new();
    for segment in path.split('.') {
        let (name, mut indexes) = segment.find('[').map_or((segment, ""), |at| segment.split_at(at));
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
            return None;
        }
        parts.push(PathPart::Key(name.to_string()));
        while let Some(rest) = indexes.strip_prefix('[') {
            let (n, after) = rest.split_once(']')?;
            parts.push(PathPart::Index(n.parse().ok()?));
            indexes = after;
        }
        if !indexes.is_empty() {
            return None;
        }
    }
    Some(parts)
}

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathPart {
    Key(String),
    Index(usize),
}

/// The value at `path` (dot notation; empty: the whole value).
pub fn read_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    if path.is_empty() {
        return Some(value);
    }
    parse_path(path)?.iter().try_fold(value, |v, part| match part {
        PathPart::Key(k) => v.get(k),
        PathPart::Index(i) => v.get(i),
    })
}

/// Sets `path` in `target` to `value`, making the objects and arrays on the way.
pub fn write_path(target: &mut Value, path: &str, value: Value) {
    let Some(parts) = parse_path(path) else { return };
    let mut at = target;
    for part in parts {
        at = match part {
            PathPart::Key(k) => {
                if !at.is_object() {
                    *at = json!({});
                }
                at.as_object_mut().expect("made an object").entry(k).or_insert(Value::Null)
            }
            PathPart::Index(i) => {
                if !at.is_array() {
                    *at = json!([]);
                }
                let items = at.as_array_mut().expect("made an array");
                if items.len() <= i {
                    items.resize(i + 1, Value::Null);
                }
                &mut items[i]
            }
        };
    }
    *at = value;
}

/// Removes what `path` names from a tool's JSON Schema `parameters` (its property and its place in
/// `required`), so the model neither sees nor chooses an overridden argument; an object left with
/// no property goes too.
pub fn hide_path(schema: &mut Value, path: &str) {
    if let Some(parts) = parse_path(path) {
        hide(schema, &parts);
    }
}

/// Hides `parts` under `node`; whether `node` is left an object schema with no property.
fn hide(node: &mut Value, parts: &[PathPart]) -> bool {
    let Some(PathPart::Key(key)) = parts.first() else { return false };
    let leaf = parts.len() == 1 || matches!(parts.get(1), Some(PathPart::Index(_)));
    let emptied = leaf || node.get_mut("properties").and_then(|p| p.get_mut(key)).is_some_and(|c| hide(c, &parts[1..]));
    if emptied {
        if let Some(props) = node.get_mut("properties").and_then(Value::as_object_mut) {
            props.remove(key);
        }
        if let Some(required) = node.get_mut("required").and_then(Value::as_array_mut) {
            required.retain(|r| r != key);
        }
    }
    node.get("properties").and_then(Value::as_object).is_some_and(Map::is_empty)
}

impl AgentConfig {
    pub fn is_empty(&self) -> bool {
        *self == AgentConfig::default()
    }

    /// Checks every part; `secret_names` are the agent's secrets once this change is applied.
    /// `enabled_tools` may not share a name with a tool configuration.
    pub fn check(&self, enabled_tools: &[String]) -> Result<(), String> {
        self.check_steps()?;
        for (name, skill) in &self.skills {
            check_name("skills key", name)?;
            bounded_text(&format!("skills.{name}.content"), &skill.content)?;
        }
        for (name, schema) in &self.output_schemas {
            check_name("output_schemas key", name)?;
            check_output_schema(&format!("output_schemas.{name}"), schema)?;
        }
        if let Some(name) = &self.output_schema {
            self.schema_named("output_schema", name)?;
        }
        for name in self.secrets.keys() {
            check_name("secrets key", name)?;
        }
        for (name, config) in &self.tool_configurations {
            self.check_configuration(name, config, enabled_tools)?;
        }
        let counts = [
            ("steps", self.steps.len()),
            ("skills", self.skills.len()),
            ("tool_configurations", self.tool_configurations.len()),
            ("secrets", self.secrets.len()),
            ("output_schemas", self.output_schemas.len()),
        ];
        if let Some((field, _)) = counts.iter().find(|(_, n)| *n > MAX_PARTS) {
            return Err(format!("{field} has more than {MAX_PARTS} entries"));
        }
        if self.transition_limit.is_some_and(|n| !(1..=MAX_TRANSITIONS).contains(&n)) {
            return Err(format!("transition_limit must be 1-{MAX_TRANSITIONS}"));
        }
        Ok(())
    }

    fn check_steps(&self) -> Result<(), String> {
        match (&self.first_step_name, self.steps.is_empty()) {
            (None, false) => return Err("first_step_name is required when steps are given".into()),
            (Some(first), _) if !self.steps.contains_key(first) => {
                return Err(format!("first_step_name {first:?} is not a key of steps"));
            }
            _ => {}
        }
        for (name, step) in &self.steps {
            check_name("steps key", name)?;
            bounded_text(&format!("steps.{name}.instructions"), &step.instructions)?;
            for (i, next) in step.next_steps.iter().enumerate() {
                if !self.steps.contains_key(next) {
                    return Err(format!("steps.{name}.next_steps[{i}] {next:?} is not a key of steps"));
                }
            }
            if let Some(schema) = &step.output_schema {
                self.schema_named(&format!("steps.{name}.output_schema"), schema)?;
            }
        }
        Ok(())
    }

    fn schema_named(&self, field: &str, name: &str) -> Result<(), String> {
        if self.output_schemas.contains_key(name) {
            Ok(())
        } else {
            Err(format!("{field} {name:?} is not a key of output_schemas"))
        }
    }

    fn check_configuration(&self, name: &str, config: &ToolConfiguration, enabled: &[String]) -> Result<(), String> {
        check_name("tool_configurations key", name)?;
        let field = format!("tool_configurations.{name}");
        let builtin = [TRANSITION_TOOL, crate::artifacts::LOAD_IMAGE_TOOL];
        if builtin.contains(&name) || enabled.iter().any(|t| t == name) {
            return Err(format!("{field}: the name is taken (an enabled tool, or a built-in one: {builtin:?})"));
        }
        check_name(&format!("{field}.tool_name"), &config.tool_name)?;
        if let Some(problem) = config.approval_settings().problem(&format!("{field}.")) {
            return Err(problem);
        }
        for (path, value) in &config.argument_overrides {
            if parse_path(path).is_none() {
                return Err(format!("{field}.argument_overrides: {path:?} is not a dot-notation path"));
            }
            let at = format!("{field}.argument_overrides.{path}");
            match Reference::of(value).map_err(|e| format!("{at}: {e}"))? {
                Some(Reference::Secret(secret)) if !self.secrets.contains_key(&secret) => {
                    return Err(format!("{at}: $ref names secret {secret:?}, which the agent does not have"));
                }
                Some(Reference::ToolOutput(other, _)) if !self.tool_configurations.contains_key(&other) => {
                    return Err(format!(
                        "{at}: $ref names tool configuration {other:?}, which the agent does not have"
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The step a turn runs in: the input's `entry_step`, else the session's, else the first.
    pub fn starting_step(&self, entry: Option<&str>, session: Option<&str>) -> Option<String> {
        let known = |s: &&str| self.steps.contains_key(*s);
        entry.or(session.filter(known)).or(self.first_step_name.as_deref()).map(str::to_string)
    }

    /// The output schema an answer given in `step` ends with: the step's, else the agent's.
    pub fn answer_schema(&self, step: Option<&str>) -> Option<(&str, &Value)> {
        let named = step.and_then(|s| self.steps.get(s)).and_then(|s| s.output_schema.as_ref());
        let name = named.or(self.output_schema.as_ref())?;
        self.output_schemas.get_key_value(name).map(|(k, v)| (k.as_str(), v))
    }

    /// The system prompt in `step`: the agent's instructions, then the step's, then the steps it
    /// may hand off to.
    pub fn system_prompt(&self, instructions: &str, step: Option<&str>) -> String {
        let Some((name, current)) = step.and_then(|s| self.steps.get_key_value(s)) else {
            return instructions.to_string();
        };
        let mut prompt = format!("{instructions}\n\n## Current step: {name}\n{}", current.instructions);
        if !current.next_steps.is_empty() {
            prompt.push_str(&format!(
                "\n\nWhen this step is done, hand off with the `{TRANSITION_TOOL}` tool to one of:"
            ));
            for next in &current.next_steps {
                let about = self.steps.get(next).and_then(|s| s.description.as_deref()).unwrap_or("");
                prompt.push_str(&format!("\n- {next}: {about}"));
            }
        }
        prompt
    }

    /// The transition tool's OpenAI function spec in `step`, if the step may hand off.
    pub fn transition_spec(&self, step: Option<&str>) -> Option<Value> {
        let next = &self.steps.get(step?)?.next_steps;
        (!next.is_empty()).then(|| {
            json!({"type": "function", "function": {
                "name": TRANSITION_TOOL,
                "description": "Hand the conversation off to another step of this agent.",
                "parameters": {"type": "object", "properties": {
                    "step_name": {"type": "string", "enum": next},
                    "handoff_message": {"type": "string", "description": "What the next step must know."}
                }, "required": ["step_name", "handoff_message"]}
            }})
        })
    }

    /// Whether `from` may hand off to `to`; the error is what the model is told.
    pub fn check_transition(&self, from: Option<&str>, to: &str) -> Result<(), String> {
        let allowed = from.and_then(|f| self.steps.get(f)).map(|s| s.next_steps.as_slice()).unwrap_or_default();
        if allowed.iter().any(|n| n == to) {
            Ok(())
        } else {
            Err(format!("step {to:?} is not one this step may hand off to (allowed: {})", allowed.join(", ")))
        }
    }

    /// How many transitions one turn may make.
    pub fn transitions_allowed(&self) -> u32 {
        self.transition_limit.unwrap_or(MAX_TRANSITIONS)
    }

    /// The agent as the API shows it: every secret's value masked.
    pub fn masked(&self) -> AgentConfig {
        let secrets = self.secrets.keys().map(|k| (k.clone(), MASK.to_string())).collect();
        AgentConfig { secrets, ..self.clone() }
    }
}

/// An output schema: a valid JSON Schema for an object (what providers' JSON-schema response
/// formats take), at most 32 KiB.
fn check_output_schema(field: &str, schema: &Value) -> Result<(), String> {
    if serde_json::to_vec(schema).map_or(0, |v| v.len()) > MAX_SCHEMA_BYTES {
        return Err(format!("{field} is larger than 32 KiB"));
    }
    if schema.get("type") != Some(&json!("object")) {
        return Err(format!("{field} must be a JSON Schema whose type is \"object\""));
    }
    ToolSchema::compile_at(schema, field).map(|_| ()).map_err(|e| e.to_string())
}

/// Checks an answer against its output schema: the content parsed as JSON (a fenced ```json
/// block too), or the problem the error event names.
pub fn check_answer(schema_name: &str, schema: &Value, answer: &str) -> Result<Value, String> {
    let trimmed = answer.trim();
    let body = trimmed
        .strip_prefix("```json")
        .or_else(|| trimmed.strip_prefix("```"))
        .and_then(|s| s.strip_suffix("```"))
        .unwrap_or(trimmed);
    let content: Value = serde_json::from_str(body.trim())
        .map_err(|e| format!("the answer is not JSON for output schema {schema_name:?}: {e}"))?;
    let compiled = ToolSchema::compile_at(schema, "content").map_err(|e| e.detail)?;
    compiled
        .check_at(&content, "content")
        .map_err(|e| format!("the answer does not match output schema {schema_name:?}: {e}"))?;
    Ok(content)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stepped() -> AgentConfig {
        serde_json::from_value(json!({
            "steps": {
                "triage": {"instructions": "Find out what the user needs.", "next_steps": ["billing"]},
                "billing": {"instructions": "Settle the bill.", "description": "money matters", "output_schema": "invoice"}
            },
            "first_step_name": "triage",
            "skills": {"refunds": {"content": "Refunds take 5 days."}},
            "secrets": {"crm_key": "v1.sealed"},
            "tool_configurations": {"crm_lookup": {"tool_name": "crm", "argument_overrides": {
                "auth.key": {"$ref": "secrets.crm_key"}, "region": "eu", "account": {"$ref": "metadata.account_id"}}}},
            "output_schemas": {"invoice": {"type": "object", "properties": {"total": {"type": "number"}}, "required": ["total"]}},
            "transition_limit": 3
        }))
        .unwrap()
    }

    #[test]
    fn a_whole_agent_passes_and_each_problem_names_its_field() {
        assert_eq!(stepped().check(&[]), Ok(()));
        type Change = Box<dyn Fn(&mut AgentConfig)>;
        // crm_lookup with one more argument override.
        let overriding = |path: &'static str, value: Value| -> Change {
            Box::new(move |a| {
                let overrides = &mut a.tool_configurations.get_mut("crm_lookup").unwrap().argument_overrides;
                overrides.insert(path.into(), value.clone());
            })
        };
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|a| a.first_step_name = Some("nowhere".into())), "first_step_name \"nowhere\""),
            (Box::new(|a| a.first_step_name = None), "first_step_name is required"),
            (
                Box::new(|a| a.steps.get_mut("triage").unwrap().next_steps.push("x".into())),
                "steps.triage.next_steps[1]",
            ),
            (
                Box::new(|a| a.steps.get_mut("billing").unwrap().output_schema = Some("y".into())),
                "steps.billing.output_schema",
            ),
            (Box::new(|a| a.skills.get_mut("refunds").unwrap().content = " ".into()), "skills.refunds.content"),
            (
                overriding("k", json!({"$ref": "secrets.none"})),
                "tool_configurations.crm_lookup.argument_overrides.k: $ref names secret \"none\"",
            ),
            (
                overriding("k", json!({"$ref": "env.HOME"})),
                "tool_configurations.crm_lookup.argument_overrides.k: $ref \"env.HOME\"",
            ),
            (overriding("a..b", json!(1)), "tool_configurations.crm_lookup.argument_overrides: \"a..b\""),
            (
                Box::new(|a| {
                    a.output_schemas.insert("bad".into(), json!({"type": "object", "properties": {"q": {"type": 5}}}));
                }),
                "output_schemas.bad is not a valid JSON Schema",
            ),
            (
                Box::new(|a| {
                    a.output_schemas.insert("list".into(), json!({"type": "array"}));
                }),
                "output_schemas.list must be",
            ),
            (Box::new(|a| a.transition_limit = Some(0)), "transition_limit"),
        ];
        for (change, expected) in cases {
            let mut agent = stepped();
            change(&mut agent);
            let e = agent.check(&[]).unwrap_err();
            assert!(e.starts_with(expected), "{e} should start with {expected}");
        }
        let e = stepped().check(&["crm_lookup".into()]).unwrap_err();
        assert!(e.contains("the name is taken"), "{e}");
    }

    #[test]
    fn references_read_their_root_and_path() {
        assert_eq!(Reference::of(&json!({"$ref": "secrets.k"})), Ok(Some(Reference::Secret("k".into()))));
        assert_eq!(
            Reference::of(&json!({"$ref": "metadata.user.id"})),
            Ok(Some(Reference::Metadata("user".into(), "id".into())))
        );
        assert_eq!(
            Reference::of(&json!({"$ref": "tool_outputs.search.items[0].id"})),
            Ok(Some(Reference::ToolOutput("search".into(), "items[0].id".into())))
        );
        assert_eq!(Reference::of(&json!("literal")), Ok(None));
        assert_eq!(Reference::of(&json!({"$ref": "x", "other": 1})), Ok(None), "not only a $ref: a literal object");
        assert!(Reference::of(&json!({"$ref": "secrets.k.sub"})).is_err());
    }

    #[test]
    fn overrides_resolve_lay_over_the_arguments_and_mask_secrets() {
        let agent = stepped();
        let config = &agent.tool_configurations["crm_lookup"];
        assert_eq!(config.override_paths(), ["account", "auth.key", "region"]);
        let lookup = |r: &Reference| match r {
            Reference::Secret(name) if name == "crm_key" => Ok(json!("s3cret")),
            Reference::Metadata(key, _) if key == "account_id" => Ok(json!(7)),
            other => Err(format!("{other:?} is missing")),
        };
        let resolved = config.resolve(&lookup).unwrap();
        let merged = resolved.apply(&json!({"q": "x", "region": "us"}));
        assert_eq!(merged, json!({"q": "x", "region": "eu", "account": 7, "auth": {"key": "s3cret"}}));
        assert_eq!(resolved.shown, *json!({"account": 7, "auth.key": "****", "region": "eu"}).as_object().unwrap());
        assert_eq!(resolved.secrets, ["s3cret"]);
        let mut sealed = resolved.apply_sealed(&json!({}), &|v| format!("v1.{}", v.len()));
        assert_eq!(sealed["auth"]["key"], json!({"$sealed": "v1.6"}));
        unseal(&mut sealed, &|s| (s == "v1.6").then(|| "s3cret".to_string()));
        assert_eq!(sealed["auth"]["key"], "s3cret");
        let missing = |_: &Reference| Err("no such key".to_string());
        assert!(config.resolve(&missing).unwrap_err().starts_with("argument override \"account\": no such key"));
    }

    #[test]
    fn paths_read_write_and_hide() {
        let mut v = json!({});
        write_path(&mut v, "config.auth.token", json!("t"));
        write_path(&mut v, "items[1]", json!(2));
        assert_eq!(v, json!({"config": {"auth": {"token": "t"}}, "items": [null, 2]}));
        assert_eq!(read_path(&v, "config.auth.token"), Some(&json!("t")));
        assert_eq!(read_path(&v, "items[1]"), Some(&json!(2)));
        assert_eq!(read_path(&v, ""), Some(&v));
        assert_eq!(
            parse_path("a[0][1].b"),
            Some(vec![PathPart::Key("a".into()), PathPart::Index(0), PathPart::Index(1), PathPart::Key("b".into())])
        );
        for bad in ["", "a.", ".a", "a[x]", "a[0", "a]"] {
            assert_eq!(parse_path(bad), None, "{bad}");
        }
        let mut schema = json!({"type": "object", "properties": {"q": {"type": "string"}, "auth": {"type": "object",
            "properties": {"key": {"type": "string"}, "user": {"type": "string"}}, "required": ["key", "user"]}},
            "required": ["q", "auth"]});
        hide_path(&mut schema, "auth.key");
        assert_eq!(schema["properties"]["auth"]["required"], json!(["user"]));
        assert!(schema["properties"]["auth"]["properties"].get("key").is_none());
        hide_path(&mut schema, "q");
        assert_eq!(schema["required"], json!(["auth"]));
        hide_path(&mut schema, "auth.user");
        assert_eq!(
            (schema["properties"].clone(), schema["required"].clone()),
            (json!({}), json!([])),
            "auth emptied went too"
        );
    }

    #[test]
    fn a_step_tells_its_instructions_and_where_it_may_hand_off() {
        let agent = stepped();
        assert_eq!(agent.starting_step(None, None).as_deref(), Some("triage"));
        assert_eq!(agent.starting_step(None, Some("billing")).as_deref(), Some("billing"));
        assert_eq!(agent.starting_step(None, Some("gone")).as_deref(), Some("triage"), "a step since removed");
        assert_eq!(agent.starting_step(Some("billing"), Some("triage")).as_deref(), Some("billing"));
        let prompt = agent.system_prompt("Be kind.", Some("triage"));
        assert!(prompt.starts_with("Be kind.\n\n## Current step: triage\nFind out"), "{prompt}");
        assert!(prompt.contains("- billing: money matters"), "{prompt}");
        assert_eq!(
            agent.transition_spec(Some("triage")).unwrap()["function"]["parameters"]["properties"]["step_name"]["enum"],
            json!(["billing"])
        );
        assert_eq!(agent.transition_spec(Some("billing")), None, "a final step offers no handoff");
        assert!(agent.check_transition(Some("triage"), "billing").is_ok());
        assert!(agent.check_transition(Some("billing"), "triage").unwrap_err().contains("not one this step"));
        assert_eq!(agent.answer_schema(Some("billing")).map(|(n, _)| n), Some("invoice"));
        assert_eq!(agent.answer_schema(Some("triage")), None);
        assert_eq!(agent.masked().secrets["crm_key"], MASK);
    }

    #[test]
    fn answers_are_checked_against_their_schema() {
        let agent = stepped();
        let (name, schema) = agent.answer_schema(Some("billing")).unwrap();
        assert_eq!(check_answer(name, schema, "{\"total\": 12.5}"), Ok(json!({"total": 12.5})));
        assert_eq!(check_answer(name, schema, "```json\n{\"total\": 1}\n```"), Ok(json!({"total": 1})));
        assert!(check_answer(name, schema, "twelve").unwrap_err().contains("is not JSON"));
        let e = check_answer(name, schema, "{\"total\": \"x\"}").unwrap_err();
        assert!(e.contains("content/total"), "{e}");
    }
}
