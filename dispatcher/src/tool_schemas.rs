//! The check of a tool call's parameters against its tool's schema, with the compiled schemas
//! cached briefly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::{Map, Value};

use fleet_protocol::schema::ToolSchema;
use fleet_protocol::tools::ToolExecution;

use fleet_platform::store::Registry;

use crate::error::ApiError;

/// A registered tool's compiled schema (`None`: its stored schema does not compile, which only a
/// tool registered before schemas were checked can have; its calls are not checked), and whether
/// its calls are the session client's to run (no callback: a direct call is refused).
type Compiled = Arc<(Option<ToolSchema>, bool)>;

/// Registered tools' compiled schemas for 2 s, so an enqueue neither reads Redis nor compiles a
/// schema every time; after that the tool is read again, and compiled again only if it changed.
#[derive(Default)]
pub struct SchemaCache {
    entries: Mutex<HashMap<String, Cached>>,
}

struct Cached {
    at: Instant,
    /// The tool's id and update time: what the schema was compiled from.
    version: (String, i64),
    schema: Compiled,
}

impl SchemaCache {
    const TTL: Duration = Duration::from_secs(2);

    fn fresh(&self, name: &str) -> Option<Compiled> {
        let entries = self.entries.lock().unwrap();
        entries.get(name).filter(|c| c.at.elapsed() < Self::TTL).map(|c| c.schema.clone())
    }

    fn compiled_from(&self, name: &str, version: &(String, i64)) -> Option<Compiled> {
        let entries = self.entries.lock().unwrap();
        entries.get(name).filter(|c| &c.version == version).map(|c| c.schema.clone())
    }

    fn put(&self, name: &str, version: (String, i64), schema: Compiled) {
        let mut entries = self.entries.lock().unwrap();
        if entries.len() > 10_000 {
            entries.clear();
        }
        entries.insert(name.to_string(), Cached { at: Instant::now(), version, schema });
    }

    pub(crate) fn forget(&self, name: &str) {
        self.entries.lock().unwrap().remove(name);
    }
}

/// The schema of the tool named `name`, `None` if there is no such tool.
async fn schema_of(cache: &SchemaCache, registry: &Registry, name: &str) -> Result<Option<Compiled>, ApiError> {
    if let Some(schema) = cache.fresh(name) {
        return Ok(Some(schema));
    }
    let Some(tool) = registry.get_tool(name).await? else {
        cache.forget(name);
        return Ok(None);
    };
    let version = (tool.id.clone(), tool.updated_at_ms);
    let schema = match cache.compiled_from(name, &version) {
        Some(schema) => schema,
        None => {
            let schema = ToolSchema::compile(&tool.parameters)
                .map_err(|e| tracing::warn!(tool = name, error = %e, "stored schema does not compile; calls are not checked"))
                .ok();
            Arc::new((schema, tool.execution == ToolExecution::Client))
        }
    };
    cache.put(name, version, schema.clone());
    Ok(Some(schema))
}

/// Refuses a call of an unregistered tool, or one whose parameters fail the tool's schema (422
/// naming each failing path).
pub(crate) async fn check_call(
    cache: &SchemaCache,
    registry: &Registry,
    name: &str,
    parameters: &Map<String, Value>,
) -> Result<(), ApiError> {
    let Some(schema) = schema_of(cache, registry, name).await? else {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_tool",
            format!("tool_name {name:?} is not a registered tool"),
        ));
    };
    let (schema, client) = schema.as_ref();
    if *client {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "client_tool",
            format!("tool {name:?} is run by the session's client (execution: client): a turn calls it, not POST /v1/tool-calls"),
        ));
    }
    match schema {
        Some(schema) => schema.check(&Value::Object(parameters.clone())).map_err(|e| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_parameters",
                format!("parameters do not match the schema of tool {name:?}: {e}"),
            )
        }),
        None => Ok(()),
    }
}
