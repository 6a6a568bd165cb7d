//! A data source's tool as the fleet registers it (`ds.{name}`, `ds__{name}` toward a model): its
//! name, the parameters a model gives it, and the fleet's own call that checks the source and
//! extracts its schema.

use serde_json::{json, Value};

/// The `operation` of the fleet's own call that checks a source and extracts its schema (never
/// offered to a model: its tool's schema has no such field, and the API does not take it).
pub const EXTRACT_SCHEMA: &str = "extract_schema";

/// The fleet tool that queries data source `name`.
pub fn tool_name(name: &str) -> String {
    format!("ds.{name}")
}

/// A new data source id: `ds_` and 32 random hex digits.
pub fn new_data_source_id() -> String {
    format!("ds_{}", uuid::Uuid::new_v4().simple())
}

/// What a model gives a data source's tool: one statement and its positional values.
pub fn query_tool_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "One read-only statement; $1, $2, … stand for the parameters"},
            "parameters": {"type": "array", "description": "Values for $1, $2, …, in order", "items": {}}
        },
        "required": ["query"],
        "additionalProperties": false
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sources_tool_is_a_callable_name_and_its_schema_compiles() {
        let name = tool_name("sales_database");
        assert_eq!(name, "ds.sales_database");
        assert!(crate::tools::is_callable_tool_name(&name));
        assert!(crate::schema::ToolSchema::compile(&query_tool_parameters()).is_ok());
        let id = new_data_source_id();
        assert!(id.starts_with("ds_") && id.len() == 35, "{id}");
    }
}
