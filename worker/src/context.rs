//! What a job's stages may touch: the worker's shared parts (`WorkerParts`, built once) lent to one
//! delivery as a `Cx`, with the publisher of the connection the delivery came on.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fleet_platform::broker::Publisher;
use fleet_platform::metrics::Metrics;
use fleet_platform::store::Store;
use fleet_platform::store::{StoreError, StoredTool, StoredWebhook};
use fleet_protocol::callback::MAX_RESPONSE_BYTES;
use fleet_protocol::circuit::CircuitBreaker;
use fleet_protocol::envelope::JobKind;
use fleet_protocol::limits::ToolLimits;
use fleet_protocol::schema::ToolSchema;

use crate::config::WorkerConfig;
use crate::http::CallbackClient;
use crate::llm::LlmClients;
use crate::registry::TargetCache;

/// The worker's parts every job shares, built once at start.
pub struct WorkerParts {
    pub config: WorkerConfig,
    pub store: Store,
    pub metrics: Metrics,
    pub client: CallbackClient,
    /// MCP sessions, one per server, reused by every call.
    pub mcp: fleet_platform::mcp::McpClients,
    /// Registered MCP servers as their calls reach them (headers decrypted), for the registry
    /// cache's ttl: a call does not read Redis and decrypt each time.
    pub(crate) mcp_servers: TtlCache<McpServerEntry>,
    /// Bounded pools to the registered data sources, one per source.
    pub data_sources: fleet_platform::data_sources::DataSources,
    /// The registered data sources as their queries reach them (connections opened).
    pub(crate) data_source_entries: TtlCache<DataSourceEntry>,
    pub llm: LlmClients,
    pub targets: TargetCache,
    pub(crate) tools: ToolCache,
    pub(crate) subscribers: SubscriberCache,
    pub(crate) pickups: Pickups,
    pub(crate) health_writes: Throttle,
    pub(crate) queue_names: QueueNames,
}

impl WorkerParts {
    /// The worker's parts, built from its configuration around its Redis and metrics.
    pub(crate) fn new(config: &WorkerConfig, store: Store, metrics: Metrics) -> Self {
        WorkerParts {
            client: CallbackClient::new(
                config.callback_timeout,
                config.allow_private_callbacks,
                MAX_RESPONSE_BYTES,
                &config.common.tls,
            ),
            mcp: fleet_platform::mcp::McpClients::new(),
            mcp_servers: TtlCache::new(config.registry_cache_ttl),
            data_sources: fleet_platform::data_sources::DataSources::new(config.common.tls.clone()),
            data_source_entries: TtlCache::new(config.registry_cache_ttl),
            llm: LlmClients::new(config),
            targets: TargetCache::new(config.registry_cache_ttl),
            tools: TtlCache::new(config.registry_cache_ttl),
            subscribers: TtlCache::new(config.registry_cache_ttl),
            pickups: Pickups::default(),
            health_writes: Throttle::new(Duration::from_secs(1)),
            queue_names: QueueNames::new(&config.common.topology),
            config: config.clone(),
            store,
            metrics,
        }
    }

    /// This delivery's view: the shared parts and the publisher of its connection.
    pub(crate) fn cx<'a>(&'a self, publisher: &'a Publisher) -> Cx<'a> {
        Cx {
            config: &self.config,
            store: &self.store,
            metrics: &self.metrics,
            client: &self.client,
            mcp: &self.mcp,
            mcp_servers: &self.mcp_servers,
            data_sources: &self.data_sources,
            data_source_entries: &self.data_source_entries,
            llm: &self.llm,
            targets: &self.targets,
            tools: &self.tools,
            subscribers: &self.subscribers,
            pickups: &self.pickups,
            health_writes: &self.health_writes,
            queue_names: &self.queue_names,
            publisher,
        }
    }
}

/// What a stage may touch, borrowed for one delivery.
#[derive(Clone, Copy)]
pub(crate) struct Cx<'a> {
    pub config: &'a WorkerConfig,
    pub store: &'a Store,
    pub publisher: &'a Publisher,
    pub metrics: &'a Metrics,
    pub client: &'a CallbackClient,
    pub mcp: &'a fleet_platform::mcp::McpClients,
    pub mcp_servers: &'a TtlCache<McpServerEntry>,
    pub data_sources: &'a fleet_platform::data_sources::DataSources,
    pub data_source_entries: &'a TtlCache<DataSourceEntry>,
    pub llm: &'a LlmClients,
    pub targets: &'a TargetCache,
    pub tools: &'a ToolCache,
    pub subscribers: &'a SubscriberCache,
    pub pickups: &'a Pickups,
    pub health_writes: &'a Throttle,
    pub queue_names: &'a QueueNames,
}

impl Cx<'_> {
    /// The first retry delay: how soon a job that could not go on (Redis unavailable, a session
    /// busy) asks again.
    pub(crate) fn soon(&self) -> Duration {
        self.config.common.retry.delays()[0]
    }

    pub(crate) fn finished(&self, kind: &str, outcome: &str) {
        self.metrics.jobs_finished.with_label_values(&[kind, outcome]).inc();
    }
}

/// A registered MCP server as its calls use it: where to reach it, and whether its operator lets
/// a call whose outcome is unknown be sent again.
pub(crate) type McpServerEntry = std::sync::Arc<(fleet_platform::mcp::McpServerTarget, bool)>;

/// A data source as its queries reach it: when (ms) it was read, as stored, and its target (the
/// connection's secrets opened, in memory only).
pub(crate) type DataSourceEntry =
    std::sync::Arc<(i64, fleet_platform::store::StoredDataSource, fleet_platform::data_sources::SourceTarget)>;

/// What a tool call's pipeline needs of its tool's registry entry before the attempt: its limits
/// and its circuit breaker.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ToolPolicies {
    pub(crate) limits: ToolLimits,
    pub(crate) circuit: Option<CircuitBreaker>,
}

/// A short-lived cache (the registry cache's ttl): a change reaches every worker within it.
pub(crate) struct TtlCache<V> {
    ttl: Duration,
    entries: Mutex<HashMap<String, (Instant, V)>>,
}

impl<V: Clone> TtlCache<V> {
    pub(crate) fn new(ttl: Duration) -> Self {
        TtlCache { ttl, entries: Mutex::new(HashMap::new()) }
    }

    pub(crate) fn get(&self, key: &str) -> Option<V> {
        let entries = self.entries.lock().unwrap();
        entries.get(key).filter(|(at, _)| at.elapsed() < self.ttl).map(|(_, v)| v.clone())
    }

    pub(crate) fn put(&self, key: &str, value: V) {
        let mut entries = self.entries.lock().unwrap();
        if entries.len() > 10_000 {
            entries.retain(|_, (at, _)| at.elapsed() < self.ttl);
        }
        entries.insert(key.to_string(), (Instant::now(), value));
    }

    /// Drops `key`: this worker wrote it anew, and reads it again at its next use.
    pub(crate) fn forget(&self, key: &str) {
        self.entries.lock().unwrap().remove(key);
    }
}

/// Registered tools by name (`None`: not registered), as stored: the secret only as ciphertext;
/// with when (ms) each was read.
pub(crate) type ToolCache = TtlCache<(i64, Option<std::sync::Arc<KnownTool>>)>;

/// A registry entry as cached, with its parameters schema compiled the first time a call is checked
/// against it: compiling costs far more than the check, and the schema lives and expires with the
/// entry it came from, so a tool's new schema applies as soon as the tool is read again.
pub(crate) struct KnownTool {
    pub(crate) stored: StoredTool,
    schema: std::sync::OnceLock<Option<ToolSchema>>,
    output: std::sync::OnceLock<Option<Result<ToolSchema, String>>>,
}

impl KnownTool {
    pub(crate) fn new(stored: StoredTool) -> Self {
        KnownTool { stored, schema: std::sync::OnceLock::new(), output: std::sync::OnceLock::new() }
    }

    /// Its compiled `output_schema`, when it has one (`Err`: why it does not compile), compiled
    /// once per read of the tool rather than once per call.
    pub(crate) fn output_schema(&self) -> Option<Result<&ToolSchema, &String>> {
        let compiled = self.output.get_or_init(|| {
            let schema = self.stored.output_schema.as_ref()?;
            Some(ToolSchema::compile_at(schema, "outputSchema").map_err(|e| e.to_string()))
        });
        compiled.as_ref().map(Result::as_ref)
    }

    /// Its compiled parameters schema; `None` when the stored one does not compile (one stored
    /// before the check).
    pub(crate) fn schema(&self) -> Option<&ToolSchema> {
        self.schema.get_or_init(|| ToolSchema::compile(&self.stored.parameters).ok()).as_ref()
    }
}

/// Webhook subscribers by event, with when (ms) their lookup was asked.
pub(crate) type SubscriberCache = TtlCache<(i64, std::sync::Arc<Vec<StoredWebhook>>)>;

impl Cx<'_> {
    /// A registered tool (cached).
    pub(crate) async fn tool(&self, name: &str) -> Result<Option<std::sync::Arc<KnownTool>>, StoreError> {
        if let Some((_, tool)) = self.tools.get(name) {
            return Ok(tool);
        }
        let read_ms = fleet_platform::now_ms();
        let tool = self.store.registry().get_tool(name).await?.map(|t| std::sync::Arc::new(KnownTool::new(t)));
        self.tools.put(name, (read_ms, tool.clone()));
        Ok(tool)
    }

    /// The tools `names` name, in order, for work that started at `since_ms`: a read kept from
    /// before then is read again, so what a tool became before the work started (a new
    /// description, a data source's new mappings) is what the work sees. The stale ones are read
    /// together, in one round trip.
    pub(crate) async fn tools_since(
        &self,
        names: &[&str],
        since_ms: i64,
    ) -> Result<Vec<Option<std::sync::Arc<KnownTool>>>, StoreError> {
        let mut found: Vec<Option<Option<std::sync::Arc<KnownTool>>>> = names
            .iter()
            .map(|name| self.tools.get(name).filter(|(read, _)| *read >= since_ms).map(|(_, tool)| tool))
            .collect();
        let stale: Vec<&str> = names.iter().zip(&found).filter(|(_, f)| f.is_none()).map(|(n, _)| *n).collect();
        if !stale.is_empty() {
            let read_ms = fleet_platform::now_ms();
            let mut read = self.store.registry().get_tools(&stale).await?.into_iter();
            for (name, slot) in names.iter().zip(found.iter_mut()).filter(|(_, f)| f.is_none()) {
                let tool = read.next().flatten().map(|t| std::sync::Arc::new(KnownTool::new(t)));
                self.tools.put(name, (read_ms, tool.clone()));
                *slot = Some(tool);
            }
        }
        Ok(found.into_iter().map(Option::flatten).collect())
    }

    /// A tool's policies: a tool no longer registered has none; its attempt fails on its own.
    pub(crate) async fn policies_of(&self, tool: &str) -> Result<ToolPolicies, StoreError> {
        let tool = self.tool(tool).await?;
        Ok(tool
            .map(|t| ToolPolicies { limits: t.stored.limits.clone(), circuit: t.stored.circuit_breaker })
            .unwrap_or_default())
    }

    /// The webhooks subscribed to `event` for work that started at `since_ms`: a lookup kept from
    /// before then is asked again, so a webhook registered before the work started is among them.
    pub(crate) async fn subscribers_of(
        &self,
        event: &str,
        since_ms: i64,
    ) -> Result<std::sync::Arc<Vec<StoredWebhook>>, StoreError> {
        if let Some((_, hooks)) = self.subscribers.get(event).filter(|(asked, _)| *asked >= since_ms) {
            return Ok(hooks);
        }
        let asked_ms = fleet_platform::now_ms();
        let hooks = std::sync::Arc::new(self.store.registry().subscribers(event).await?);
        self.subscribers.put(event, (asked_ms, hooks.clone()));
        Ok(hooks)
    }
}

/// The newest work-queue entry time each kind's jobs were picked up at, written to Redis at most
/// once a second (the oldest-job-age gauge reads it beside the queue's depth).
#[derive(Default)]
pub(crate) struct Pickups {
    newest: Mutex<HashMap<&'static str, (i64, bool)>>,
}

impl Pickups {
    /// Notes a job of `kind` that entered its work queue at `entered_ms`.
    pub(crate) fn note(&self, kind: &'static str, entered_ms: i64) {
        let mut newest = self.newest.lock().unwrap();
        let entry = newest.entry(kind).or_insert((0, false));
        if entered_ms > entry.0 {
            *entry = (entered_ms, true);
        }
    }

    /// The pickups not yet written, marked written.
    pub(crate) fn take_unwritten(&self) -> Vec<(&'static str, i64)> {
        let mut newest = self.newest.lock().unwrap();
        newest
            .iter_mut()
            .filter(|(_, (_, dirty))| *dirty)
            .map(|(kind, (at, dirty))| {
                *dirty = false;
                (*kind, *at)
            })
            .collect()
    }
}

/// At most one go per key per interval (per worker).
pub(crate) struct Throttle {
    every: Duration,
    last: Mutex<HashMap<String, Instant>>,
}

impl Throttle {
    pub(crate) fn new(every: Duration) -> Self {
        Throttle { every, last: Mutex::new(HashMap::new()) }
    }

    /// Whether `key` may go now (and, if so, its interval starts).
    pub(crate) fn due(&self, key: &str) -> bool {
        let mut last = self.last.lock().unwrap();
        let now = Instant::now();
        match last.get(key) {
            Some(at) if now.duration_since(*at) < self.every => false,
            _ => {
                if last.len() > 10_000 {
                    last.retain(|_, at| now.duration_since(*at) < self.every);
                }
                last.insert(key.to_string(), now);
                true
            }
        }
    }
}

/// A queue a job can come from, named once at start: a job's span names its queue, and formatting
/// the names for every job showed in the worker's profile.
pub(crate) struct QueueName {
    pub name: String,
    /// The span's OpenTelemetry name, `process <queue>`.
    pub span_name: String,
}

/// The queue names of every job kind: its work queue, and its light lane if it has one.
pub(crate) struct QueueNames {
    by_kind: Vec<(JobKind, QueueName, Option<QueueName>)>,
}

impl QueueNames {
    pub(crate) fn new(topology: &fleet_protocol::topology::Topology) -> Self {
        let named = |name: String| QueueName { span_name: format!("process {name}"), name };
        let by_kind = JobKind::ALL
            .into_iter()
            .map(|kind| (kind, named(topology.work_queue(kind)), topology.light_queue(kind).map(named)))
            .collect();
        QueueNames { by_kind }
    }

    /// `kind`'s light lane when `light` and it has one, else its work queue.
    pub(crate) fn get(&self, kind: JobKind, light: bool) -> &QueueName {
        let (_, work, lane) = self.by_kind.iter().find(|(k, _, _)| *k == kind).expect("every kind is named");
        match lane {
            Some(lane) if light => lane,
            _ => work,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(parameters: serde_json::Value) -> KnownTool {
        let stored = serde_json::json!({"name": "t", "description": "", "parameters": parameters, "callback_url": "",
            "secret_ciphertext": "", "created_at_ms": 0, "updated_at_ms": 0});
        KnownTool::new(serde_json::from_value(stored).unwrap())
    }

    #[test]
    fn a_schema_is_compiled_once_per_registry_entry() {
        let needs_a = tool(serde_json::json!({"type": "object", "required": ["a"]}));
        let first = needs_a.schema().unwrap();
        assert!(std::ptr::eq(first, needs_a.schema().unwrap()), "the same entry reuses its compiled schema");
        assert!(first.check(&serde_json::json!({})).is_err());

        // The registry entry read again after the tool changed: its own schema.
        let needs_b = tool(serde_json::json!({"type": "object", "required": ["b"]}));
        let changed = needs_b.schema().unwrap();
        assert!(changed.check(&serde_json::json!({"b": 1})).is_ok());
        assert!(changed.check(&serde_json::json!({"a": 1})).is_err());

        // A stored schema that does not compile is remembered as none, for that entry.
        let broken = tool(serde_json::json!({"type": 7}));
        assert!(broken.schema().is_none());
        assert!(broken.schema().is_none());
    }

    #[test]
    fn cached_entries_expire() {
        let cache: TtlCache<u32> = TtlCache::new(Duration::from_millis(30));
        cache.put("t", 7);
        assert_eq!(cache.get("t"), Some(7));
        assert_eq!(cache.get("u"), None);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(cache.get("t"), None);
    }

    #[test]
    fn a_throttle_lets_one_go_per_interval() {
        let t = Throttle::new(Duration::from_millis(30));
        assert!(t.due("a") && !t.due("a") && t.due("b"));
        std::thread::sleep(Duration::from_millis(40));
        assert!(t.due("a"));
    }

    #[test]
    fn pickups_keep_the_newest_and_are_written_once() {
        let p = Pickups::default();
        p.note("tool_call", 5);
        p.note("tool_call", 3);
        p.note("turn", 9);
        let mut unwritten = p.take_unwritten();
        unwritten.sort();
        assert_eq!(unwritten, vec![("tool_call", 5), ("turn", 9)]);
        assert!(p.take_unwritten().is_empty());
        p.note("turn", 8);
        assert!(p.take_unwritten().is_empty(), "older than what was written");
    }

    #[test]
    fn a_job_names_the_queue_it_came_from() {
        let topology = fleet_protocol::topology::Topology::new("fleet", fleet_protocol::retry::default_delays());
        let names = QueueNames::new(&topology);
        for kind in JobKind::ALL {
            let work = names.get(kind, false);
            assert_eq!(work.name, topology.work_queue(kind));
            assert_eq!(work.span_name, format!("process {}", work.name));
            let light = names.get(kind, true);
            assert_eq!(light.name, topology.light_queue(kind).unwrap_or_else(|| topology.work_queue(kind)));
        }
    }
}
