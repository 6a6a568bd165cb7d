//! One attempt of a call to a data source's tool (`ds.{name}`): instead of a signed POST, a
//! read-only query through the worker's bounded pool for the source, or (the fleet's own call, at
//! registration and on `refresh-schema`) its check and schema extraction, whose outcome is written
//! back to the source. What comes back is seed 002's `ExternalResult`: the rows as structured
//! content, or a failure whose code names why (the database refused a write, the statement timed
//! out, the password is wrong). Only a source that cannot be reached right now is tried again.

use fleet_platform::data_sources::{DataSourceError, DataSources, SourceTarget};
use fleet_platform::store::{ConnectionStatus, SchemaStatus, SourceUpdate, StoredDataSource};
use fleet_protocol::data_sources::{self as ds, Table};
use fleet_protocol::envelope::ToolCallJob;
use fleet_protocol::external_result::{ExternalResult, InteractionError, ResultStatus};
use fleet_protocol::tools::DataSourceRef;
use serde_json::json;

use crate::callback::{AttemptReport, AttemptVerdict, CallbackContext};

/// The job an attempt runs: its execution, when it was accepted, and the call.
pub(crate) struct SourceJob<'a> {
    pub(crate) execution_id: &'a str,
    pub(crate) since_ms: i64,
    pub(crate) call: &'a ToolCallJob,
}

/// Runs `call` against its source and judges the outcome.
pub(crate) async fn attempt(
    ctx: &CallbackContext<'_>,
    sources: &DataSources,
    job: SourceJob<'_>,
    tool: &DataSourceRef,
) -> AttemptReport {
    let call = job.call;
    let call_id = call.parent.as_ref().map_or(job.execution_id, |p| p.call_id.as_str());
    let extract = call.parameters["operation"] == ds::EXTRACT_SCHEMA;
    // An extraction reads the source as it is now (it checks the connection it was asked about);
    // a query may use the source as read since its job was accepted.
    let since_ms = if extract { i64::MAX } else { job.since_ms };
    let entry = match entry_of(ctx, &tool.source_id, since_ms).await {
        Ok(entry) => entry,
        Err(unread) => return unread.report(call_id, &call.tool_name),
    };
    let (_, found, target) = entry.as_ref();
    if extract {
        let version = call.parameters["connection_version"].as_u64().unwrap_or(0);
        ctx.data_source_entries.forget(&found.id);
        return extraction(ctx, sources, found, target, version, call_id, &call.tool_name).await;
    }
    let sql = call.parameters["query"].as_str().unwrap_or_default();
    let parameters = call.parameters["parameters"].as_array().cloned().unwrap_or_default();
    match sources.query(&found.id, target, sql, &parameters, &found.limits).await {
        Ok(rows) => {
            let value = serde_json::to_value(&rows).expect("rows serialise");
            let result = ExternalResult::success(call_id, &call.tool_name, value);
            AttemptReport {
                verdict: AttemptVerdict::Structured(Box::new(result)),
                http_status: Some(200),
                error: None,
                class: "2xx",
            }
        }
        Err(e) => judged(e, call_id, &call.tool_name),
    }
}

/// Why a source could not be read.
enum Unread {
    Gone,
    Registry(String),
    Connection(String),
}

impl Unread {
    fn report(self, call_id: &str, tool: &str) -> AttemptReport {
        match self {
            Unread::Gone => ended(call_id, tool, "data_source_gone", "the data source is no longer registered"),
            Unread::Registry(e) => unsent(format!("registry unavailable: {e}")),
            Unread::Connection(e) => {
                ended(call_id, tool, "data_source_connection", &format!("its connection cannot be read: {e}"))
            }
        }
    }
}

/// The source as read at or after `since_ms` (cached for the registry cache's ttl), its
/// connection opened.
async fn entry_of(
    ctx: &CallbackContext<'_>,
    id: &str,
    since_ms: i64,
) -> Result<crate::context::DataSourceEntry, Unread> {
    if let Some(entry) = ctx.data_source_entries.get(id).filter(|e| e.0 >= since_ms) {
        return Ok(entry);
    }
    let read_ms = fleet_platform::now_ms();
    let found = match ctx.store.registry().read_data_source(id).await {
        Ok(Some(found)) => found.source,
        Ok(None) => return Err(Unread::Gone),
        Err(e) => return Err(Unread::Registry(e.to_string())),
    };
    let owner = StoredDataSource::connection_owner(&found.id);
    let connection = found.connection.open(ctx.secrets, &owner).map_err(|e| Unread::Connection(e.to_string()))?;
    let target = SourceTarget::new(connection).with_limits(found.limits).on_networks(ctx.data_source_networks.clone());
    let entry = std::sync::Arc::new((read_ms, found, target));
    ctx.data_source_entries.put(id, entry.clone());
    Ok(entry)
}

/// The check and extraction: the source's status and tables written back (only if its
/// connection is still the one the job was asked about), its tool's description refreshed.
async fn extraction(
    ctx: &CallbackContext<'_>,
    sources: &DataSources,
    found: &StoredDataSource,
    target: &SourceTarget,
    version: u64,
    call_id: &str,
    source: &str,
) -> AttemptReport {
    let outcome = match sources.check(&found.id, target).await {
        Ok(()) => sources.extract_schema(&found.id, target).await.map_err(|e| (true, e)),
        Err(e) => Err((false, e)),
    };
    let written = match &outcome {
        Ok(tables) => record(ctx, &found.id, version, Ok(tables.clone())).await,
        Err((connected, e)) => record(ctx, &found.id, version, Err((*connected, e.to_string()))).await,
    };
    if let Err(e) = written {
        return unsent(format!("registry unavailable: {e}"));
    }
    match outcome {
        Ok(tables) => {
            let result = ExternalResult::success(call_id, source, json!({"tables": tables.len()}));
            AttemptReport {
                verdict: AttemptVerdict::Structured(Box::new(result)),
                http_status: Some(200),
                error: None,
                class: "2xx",
            }
        }
        Err((_, e)) => judged(e, call_id, source),
    }
}

/// Writes the extraction's outcome to the source, if its connection is still `version`'s.
async fn record(
    ctx: &CallbackContext<'_>,
    id: &str,
    version: u64,
    outcome: Result<Vec<Table>, (bool, String)>,
) -> Result<(), fleet_platform::store::StoreError> {
    let updated = ctx.store.registry().update_data_source(id, |source: &mut StoredDataSource| {
        if source.connection_version != version {
            return Ok::<_, fleet_platform::store::StoreError>(false);
        }
        match &outcome {
            Ok(tables) => {
                (source.status, source.schema_status, source.error) =
                    (ConnectionStatus::Connected, SchemaStatus::Ready, None);
                source.tables = tables.clone();
            }
            Err((connected, why)) => {
                source.status = if *connected { ConnectionStatus::Connected } else { ConnectionStatus::Error };
                source.schema_status = SchemaStatus::Failed;
                source.error = Some(why.clone());
            }
        }
        Ok(true)
    });
    if let SourceUpdate::Written(source) = updated.await? {
        // This worker reads the tool's new description at once (others within the registry
        // cache's ttl, or for any turn accepted after it).
        ctx.tools.forget(&fleet_protocol::data_sources::tool_name(&source.name));
    }
    Ok(())
}

/// A driver's error as the call's outcome: a source that cannot be reached is tried again on the
/// schedule; anything the database decided (a refused write, a timeout, a wrong password) ends the
/// call with its code.
fn judged(e: DataSourceError, call_id: &str, source: &str) -> AttemptReport {
    if e.is_transient() {
        let verdict = AttemptVerdict::Retryable { retry_after: None };
        return AttemptReport { verdict, http_status: None, error: Some(e.to_string()), class: "network" };
    }
    ended(call_id, source, e.code(), &e.to_string())
}

fn ended(call_id: &str, source: &str, code: &str, message: &str) -> AttemptReport {
    let error = InteractionError::safe(code, message, Some(false));
    let result = ExternalResult::ended(call_id, source, ResultStatus::Failed, error);
    let text = result.error.as_ref().map(|e| format!("{}: {}", e.code, e.message));
    AttemptReport {
        verdict: AttemptVerdict::Structured(Box::new(result)),
        http_status: None,
        error: text,
        class: "refused",
    }
}

fn unsent(error: String) -> AttemptReport {
    let verdict = AttemptVerdict::Retryable { retry_after: None };
    AttemptReport { verdict, http_status: None, error: Some(error), class: "refused" }
}
