//! Tool `parameters` as JSON Schema: checking that a registration's schema is one, and that a
//! call's parameters (from an API client or a model) satisfy it, with errors naming the paths.
//!
//! Schemas are compiled offline: a `$ref` to anything outside the schema is refused, never fetched
//! (fetching would let a registration make the fleet connect anywhere). Patterns use a linear-time
//! regex engine, so no parameter value can make a check backtrack for long.

use serde_json::Value;

/// How many failures one message lists, and how long each may be.
const MAX_LISTED: usize = 5;
const MAX_ERROR_CHARS: usize = 200;

/// Why a schema does not compile: `root` names the field the schema was given as, and `detail`
/// is `<root><pointer>: <what>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{root} is not a valid JSON Schema: {detail}")]
pub struct InvalidSchema {
    pub root: String,
    pub detail: String,
}

/// The failures of a value against the schema, each `<root>/<path>: <what>` (the root is
/// `parameters` for a call's parameters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", summary(.0))]
pub struct ParameterErrors(pub Vec<String>);

/// A tool's compiled schema.
pub struct ToolSchema(jsonschema::Validator);

impl std::fmt::Debug for ToolSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ToolSchema")
    }
}

impl ToolSchema {
    /// Compiles a tool's `parameters` schema.
    pub fn compile(schema: &Value) -> Result<Self, InvalidSchema> {
        Self::compile_at(schema, "parameters")
    }

    /// Compiles a schema given as the field `root` (an output schema, say): errors name it.
    pub fn compile_at(schema: &Value, root: &str) -> Result<Self, InvalidSchema> {
        jsonschema::options()
            .offline()
            .with_pattern_options(jsonschema::PatternOptions::regex().size_limit(1 << 20))
            .build(schema)
            .map(ToolSchema)
            .map_err(|e| InvalidSchema {
                root: root.to_string(),
                detail: located(root, e.instance_path().as_str(), &e.to_string()),
            })
    }

    /// Checks `parameters` (the call's whole object) against the schema.
    pub fn check(&self, parameters: &Value) -> Result<(), ParameterErrors> {
        self.check_at(parameters, "parameters")
    }

    /// Checks `value`, the field `root` (a tool's output, say): each failure names its path in it.
    pub fn check_at(&self, value: &Value, root: &str) -> Result<(), ParameterErrors> {
        let errors: Vec<String> =
            self.0.iter_errors(value).map(|e| located(root, e.instance_path().as_str(), &e.to_string())).collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ParameterErrors(errors))
        }
    }
}

/// `<root>/<pointer>: <message>`, the message cut to a bound (it quotes the offending value).
fn located(root: &str, pointer: &str, message: &str) -> String {
    let mut text: String = message.chars().take(MAX_ERROR_CHARS).collect();
    if text.len() < message.len() {
        text.push('…');
    }
    format!("{root}{pointer}: {text}")
}

fn summary(errors: &[String]) -> String {
    let mut text = errors.iter().take(MAX_LISTED).cloned().collect::<Vec<_>>().join("; ");
    if errors.len() > MAX_LISTED {
        text.push_str(&format!("; and {} more", errors.len() - MAX_LISTED));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn seed_schema() -> Value {
        json!({"type": "object", "properties": {
            "query": {"type": "string"},
            "category": {"type": "string", "enum": ["electronics", "clothing"]},
            "max_results": {"type": "integer", "default": 10}
        }, "required": ["query"]})
    }

    #[test]
    fn a_call_is_checked_and_failures_name_their_paths() {
        let schema = ToolSchema::compile(&seed_schema()).unwrap();
        assert!(schema.check(&json!({"query": "laptop", "max_results": 5})).is_ok());
        let e = schema.check(&json!({"query": 5, "max_results": "ten"})).unwrap_err();
        assert_eq!(e.0.len(), 2, "{e}");
        assert!(e.to_string().contains("parameters/query: 5 is not of type \"string\""), "{e}");
        assert!(e.to_string().contains("parameters/max_results:"), "{e}");
        let e = schema.check(&json!({})).unwrap_err();
        assert!(e.to_string().starts_with("parameters: ") && e.to_string().contains("\"query\""), "{e}");
    }

    #[test]
    fn messages_stay_bounded() {
        let schema =
            ToolSchema::compile(&json!({"type": "object", "additionalProperties": {"type": "integer"}})).unwrap();
        let many: serde_json::Map<String, Value> =
            (0..20).map(|i| (format!("k{i}"), json!("x".repeat(1000)))).collect();
        let e = schema.check(&Value::Object(many)).unwrap_err();
        assert!(e.to_string().contains("and 15 more"), "{e}");
        assert!(e.to_string().chars().count() < 1500, "{}", e.to_string().len());
    }

    #[test]
    fn invalid_schemas_and_remote_references_are_refused() {
        for bad in [
            json!({"type": "strnig"}),
            json!({"type": "object", "properties": {"q": {"type": 5}}}),
            json!({"required": "query"}),
            json!({"properties": {"q": {"pattern": "(unclosed"}}}),
            json!({"$ref": "https://schemas.example.com/tool.json"}),
        ] {
            let e = ToolSchema::compile(&bad).unwrap_err();
            assert!(e.to_string().starts_with("parameters is not a valid JSON Schema: parameters"), "{bad}: {e}");
        }
        assert!(
            ToolSchema::compile(&json!({"type": "object", "$defs": {"q": {"type": "string"}},
            "properties": {"q": {"$ref": "#/$defs/q"}}}))
            .is_ok(),
            "local references resolve"
        );
    }
}
