//! Redis: the tool registry, execution records, idempotency claims (leases with fencing tokens),
//! client `Idempotency-Key` reservations and dead-letter records.
//!
//! Every Lua script touches keys of one hash slot only (one key, or keys sharing a `{hash tag}`),
//! so every operation works on Redis Cluster as well.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::{AsyncCommands, Script};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use fleet_protocol::deadletter::Retention;
use fleet_protocol::execution::{field, AttemptRecord, ExecutionStatus};
use fleet_protocol::idempotency::{decide, Decision, RequestRecord, RequestState};
use fleet_protocol::keys::Keys;
use fleet_protocol::limits::ToolLimits;
use fleet_protocol::IDEMPOTENCY_TTL_SECS;

use crate::metrics::Metrics;
use crate::tls::ClientTls;

mod cancel;
mod connection;
mod health;
mod limits;
mod turns;

pub use cancel::{Begin, CancelRequest};
pub(crate) use connection::Conn;
use connection::{Backend, Connector};
pub use health::{Admission, ToolHealth, Transition};
pub use limits::{Pace, SlotGrant};
pub use turns::{SessionFinish, SessionSlot};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis unavailable: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("stored value is corrupt: {0}")]
    Corrupt(String),
}

/// A registered tool as stored: the secret only as ciphertext.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredTool {
    /// The id the API hands out (`tool_…`); empty for a tool stored before tools had ids, until
    /// the dispatcher gives it one.
    #[serde(default)]
    pub id: String,
    pub name: String,
    pub description: String,
    pub parameters: Value,
    pub callback_url: String,
    pub secret_ciphertext: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Signature scheme and, during a secret rotation, the previous secret (ciphertext).
    #[serde(default, skip_serializing_if = "fleet_protocol::signature_scheme::Signing::is_default")]
    pub signing: fleet_protocol::signature_scheme::Signing,
    /// The tool's own retry schedule; none: the fleet's default (`FLEET_RETRY_DELAYS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<fleet_protocol::retry_spec::RetrySpec>,
    /// `max_concurrency` and `rate_limit` (`store/limits.rs` enforces them).
    #[serde(default, skip_serializing_if = "ToolLimits::is_none")]
    pub limits: ToolLimits,
    /// Its own circuit-breaker policy, if it has one (`store/health.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<fleet_protocol::circuit::CircuitBreaker>,
}

/// A tool as read, with the stored text that a conditional write compares against.
#[derive(Debug, Clone)]
pub struct ToolVersion {
    pub tool: StoredTool,
    raw: String,
}

/// A registered webhook as stored: the secret only as ciphertext.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredWebhook {
    pub id: String,
    pub url: String,
    pub events: Vec<String>,
    pub secret_ciphertext: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Signature scheme and, during a secret rotation, the previous secret (ciphertext).
    #[serde(default, skip_serializing_if = "fleet_protocol::signature_scheme::Signing::is_default")]
    pub signing: fleet_protocol::signature_scheme::Signing,
    /// The webhook's own retry schedule; none: the fleet's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<fleet_protocol::retry_spec::RetrySpec>,
}

/// The outcome of trying to claim an execution before running it.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// This worker holds the lease; `token` fences its later writes.
    Acquired { token: u64 },
    /// The execution already succeeded; here is its result. Nothing may run again.
    AlreadyDone { result: Value },
    /// Another worker holds a live lease for `remaining`.
    Busy { remaining: Duration },
}

/// What `reserve_request` found for a client's `Idempotency-Key`.
#[derive(Debug, Clone, PartialEq)]
pub enum Reservation {
    /// First use: the caller holds the key and must publish, then `confirm_request` (or
    /// `release_request` if the job certainly was not sent, `abandon_request` if unsure).
    New(RequestHold),
    /// A previous request with this key was accepted as this execution.
    Existing(String),
    /// A request with this key is being accepted right now.
    InProgress,
    /// A previous request reserved this execution but its publish was never confirmed: the caller
    /// now holds the key and must publish the same execution again.
    Unconfirmed(RequestHold),
    /// The key was used before with a different body.
    Reused,
}

/// A request's hold on its key: the exact value it wrote, so that it only undoes its own write.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestHold {
    key: String,
    raw: String,
    pub record: RequestRecord,
}

impl RequestHold {
    pub fn execution_id(&self) -> &str {
        &self.record.execution_id
    }
}

/// An execution record as read back.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExecutionView {
    pub execution_id: String,
    pub kind: String,
    pub status: ExecutionStatus,
    pub tool_name: Option<String>,
    pub room_id: Option<String>,
    pub assistant_id: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// When a scheduled call is due (ms); `None` for one that ran (or runs) as soon as it could.
    pub run_at_ms: Option<i64>,
    pub result: Option<Value>,
    pub last_error: Option<String>,
    pub attempts: Vec<AttemptRecord>,
}

/// The fields a new execution record starts with.
pub struct NewExecution<'a> {
    pub execution_id: &'a str,
    pub kind: &'a str,
    pub tool_name: Option<&'a str>,
    pub room_id: Option<&'a str>,
    pub assistant_id: Option<&'a str>,
    pub now_ms: i64,
    /// When a scheduled call is due (ms); it counts as waiting only from then.
    pub run_at_ms: Option<i64>,
}

const CLAIM_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local raw = redis.call('GET', KEYS[1])
local token = 0
if raw then
  local v = cjson.decode(raw)
  if v.state == 'done' then return {'done', raw} end
  if v.state == 'claimed' and tonumber(v.lease_until) > now then
    return {'busy', tostring(tonumber(v.lease_until) - now)}
  end
  token = tonumber(v.token) or 0
end
token = token + 1
redis.call('SET', KEYS[1], cjson.encode({state = 'claimed', token = token, owner = ARGV[1],
  lease_until = now + tonumber(ARGV[2])}), 'EX', ARGV[3])
return {'claimed', tostring(token)}
"#;

/// Replaces the value only if it is still exactly `ARGV[1]` (an empty `ARGV[2]` deletes it).
const SWAP_LUA: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3]) end
return 1
"#;

const RENEW_LUA: &str = r#"
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local v = cjson.decode(raw)
if v.state ~= 'claimed' or tonumber(v.token) ~= tonumber(ARGV[1]) then return 0 end
local t = redis.call('TIME')
v.lease_until = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
redis.call('SET', KEYS[1], cjson.encode(v), 'EX', ARGV[3])
return 1
"#;

// The result is spliced in as text, never decoded by Lua, so its numbers keep full precision.
// A missing claim was lost, not taken (nothing deletes one; a Redis failover can drop the newest
// writes, since replication is asynchronous): nobody else holds it, so the result is kept (2)
// rather than dropped with the job acked and its record left `running`. A claim already done by
// the same token is this worker's own result: a retry whose first call ran but lost its reply.
const COMPLETE_LUA: &str = r#"
local done = '{"state":"done","token":' .. ARGV[1] .. ',"result":' .. ARGV[2] .. '}'
local raw = redis.call('GET', KEYS[1])
if not raw then
  redis.call('SET', KEYS[1], done, 'EX', ARGV[3])
  return 2
end
local v = cjson.decode(raw)
if v.state == 'done' and tonumber(v.token) == tonumber(ARGV[1]) then return 1 end
if v.state ~= 'claimed' or tonumber(v.token) ~= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], done, 'EX', ARGV[3])
return 1
"#;

const RELEASE_LUA: &str = r#"
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local v = cjson.decode(raw)
if v.state ~= 'claimed' or tonumber(v.token) ~= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], cjson.encode({state = ARGV[2], token = v.token}), 'EX', ARGV[3])
return 1
"#;

// One execution's record and its attempts list share a hash tag, so on Redis Cluster they live in
// one slot and one script may touch both. The claim key does not share it (its name is the
// spec's), so the record keeps its own fence: the newest claim token that wrote to it.
// A cancelled record takes no more worker writes (2): a tool call's `running` write is what a
// cancel races with, and this one script decides which came first.
// ARGV: token, ttl, attempt JSON (or ''), then field, value pairs.
const FENCED_RECORD_LUA: &str = r#"
local current = redis.call('HMGET', KEYS[1], 'fence', 'status')
if current[2] == 'cancelled' then return 2 end
local fence = tonumber(current[1] or '0')
if fence > tonumber(ARGV[1]) then return 0 end
local fields = {'fence', ARGV[1]}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], ARGV[2])
if ARGV[3] ~= '' then
  redis.call('RPUSH', KEYS[2], ARGV[3])
  redis.call('EXPIRE', KEYS[2], ARGV[2])
end
return 1
"#;

/// Writes a tool only if its entry is still what the writer read (`ARGV[1]`, empty: absent), and
/// keeps the id index in step. KEYS: entry, name index, id index (one `{tools}` slot).
const TOOL_WRITE_LUA: &str = r#"
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], 0, ARGV[3])
if ARGV[5] ~= '' and ARGV[5] ~= ARGV[4] then redis.call('HDEL', KEYS[3], ARGV[5]) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[3], ARGV[4], ARGV[3]) end
return 1
"#;

/// Deletes a tool (only the one with id `ARGV[2]`, unless empty) with its index entries.
const TOOL_DELETE_LUA: &str = r#"
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local ok, rec = pcall(cjson.decode, cur)
local id = (ok and type(rec) == 'table' and type(rec.id) == 'string') and rec.id or ''
if ARGV[2] ~= '' and ARGV[2] ~= id then return 0 end
if id ~= '' then redis.call('HDEL', KEYS[3], id) end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"#;

/// Which registry an entry belongs to.
#[derive(Debug, Clone, Copy)]
enum Registry {
    Webhooks,
}

impl Registry {
    fn entry(self, keys: &Keys, id: &str) -> String {
        match self {
            Registry::Webhooks => keys.webhook(id),
        }
    }
    fn index(self, keys: &Keys) -> String {
        match self {
            Registry::Webhooks => keys.webhooks_index(),
        }
    }
    fn label(self) -> &'static str {
        match self {
            Registry::Webhooks => "webhook",
        }
    }
}

// Scripts are built once per process: `Script::new` hashes its source (SHA-1), and a Store is
// cloned into every request's state.
static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(CLAIM_LUA));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));
static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::new(COMPLETE_LUA));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
pub(crate) static FENCED_RECORD: LazyLock<Script> = LazyLock::new(|| Script::new(FENCED_RECORD_LUA));
static SWAP: LazyLock<Script> = LazyLock::new(|| Script::new(SWAP_LUA));
static TOOL_WRITE: LazyLock<Script> = LazyLock::new(|| Script::new(TOOL_WRITE_LUA));
static TOOL_DELETE: LazyLock<Script> = LazyLock::new(|| Script::new(TOOL_DELETE_LUA));

#[derive(Clone)]
pub struct Store {
    backend: std::sync::Arc<Backend>,
    /// The URL(s) it was opened with: a Pub/Sub subscriber connects to one of them.
    pub(crate) nodes: std::sync::Arc<Vec<String>>,
    pub(crate) timeout: Duration,
    keys: Keys,
    metrics: Metrics,
    pub(crate) dead_letter_retention: Retention,
}

impl Store {
    /// A lazily connecting, self-reconnecting client: the process starts even while Redis is down.
    /// Several comma-separated URLs name the seed nodes of a Redis Cluster.
    /// `rediss://` URLs connect over TLS with `tls`'s roots and client certificate.
    pub fn open(
        url: &str,
        keys: Keys,
        timeout: Duration,
        metrics: Metrics,
        tls: &ClientTls,
    ) -> Result<Self, StoreError> {
        let nodes: Vec<&str> = url.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
        let secure = nodes.iter().any(|n| n.starts_with("rediss://"));
        let node_urls: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        let connector = if nodes.len() > 1 {
            let mut builder =
                redis::cluster::ClusterClient::builder(nodes).connection_timeout(timeout).response_timeout(timeout);
            if secure {
                builder = builder.certs(tls.redis_certificates());
            }
            Connector::Cluster { client: builder.build()? }
        } else {
            let client = if secure {
                redis::Client::build_with_tls(url, tls.redis_certificates())?
            } else {
                redis::Client::open(url)?
            };
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_secs(2));
            Connector::Single { client, config }
        };
        Ok(Store {
            backend: std::sync::Arc::new(Backend::new(connector)),
            nodes: std::sync::Arc::new(node_urls),
            timeout,
            keys,
            metrics,
            dead_letter_retention: Retention::default(),
        })
    }

    /// How long and how many dead letters are kept (default: 30 days, 100,000).
    pub fn with_dead_letter_retention(mut self, retention: Retention) -> Self {
        self.dead_letter_retention = retention;
        self
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub(crate) async fn conn(&self) -> Result<Conn, StoreError> {
        match self.backend.conn().await {
            Ok(conn) => Ok(conn),
            // Having a connection says nothing of its health: only a failure counts here.
            Err(e) => self.count(Err(e)),
        }
    }

    /// Every command's result passes here: errors are counted, and a run of them makes the next
    /// command start over with a new connection.
    pub(crate) fn count<T>(&self, r: Result<T, redis::RedisError>) -> Result<T, StoreError> {
        match r {
            Ok(v) => {
                self.backend.succeeded();
                Ok(v)
            }
            Err(e) => {
                self.metrics.redis_errors.inc();
                self.backend.failed(&e);
                Err(StoreError::Redis(e))
            }
        }
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        let pong: Result<String, _> = redis::cmd("PING").query_async(&mut self.conn().await?).await;
        self.count(pong).map(|_| ())
    }

    /// Redis's `maxmemory-policy`, to warn when it may evict idempotency keys.
    pub async fn maxmemory_policy(&self) -> Result<String, StoreError> {
        let r: Result<Vec<String>, _> =
            redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy").query_async(&mut self.conn().await?).await;
        Ok(self.count(r)?.get(1).cloned().unwrap_or_default())
    }

    // ---- registries (tools, webhooks): an entry per id plus a lexically sorted index ----

    /// Creates or replaces an entry; returns whether it is new.
    async fn registry_put<T: Serialize>(&self, reg: Registry, id: &str, value: &T) -> Result<bool, StoreError> {
        let key = reg.entry(&self.keys, id);
        let json = serde_json::to_string(value).expect("a registry entry serialises");
        let r: Result<(Option<String>,), _> = redis::pipe()
            .atomic()
            .cmd("GET")
            .arg(&key)
            .cmd("SET")
            .arg(&key)
            .arg(json)
            .ignore()
            .cmd("ZADD")
            .arg(reg.index(&self.keys))
            .arg(0)
            .arg(id)
            .ignore()
            .query_async(&mut self.conn().await?)
            .await;
        Ok(self.count(r)?.0.is_none())
    }

    async fn registry_get<T: serde::de::DeserializeOwned>(
        &self,
        reg: Registry,
        id: &str,
    ) -> Result<Option<T>, StoreError> {
        let raw: Result<Option<String>, _> = self.conn().await?.get(reg.entry(&self.keys, id)).await;
        self.count(raw)?
            .map(|raw| {
                serde_json::from_str(&raw).map_err(|e| StoreError::Corrupt(format!("{} {id}: {e}", reg.label())))
            })
            .transpose()
    }

    /// Entries in id order after `after`, at most `limit`.
    async fn registry_list<T: serde::de::DeserializeOwned>(
        &self,
        reg: Registry,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<T>, StoreError> {
        let min = after.map(|a| format!("({a}")).unwrap_or_else(|| "-".into());
        let ids: Result<Vec<String>, _> = redis::cmd("ZRANGEBYLEX")
            .arg(reg.index(&self.keys))
            .arg(min)
            .arg("+")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut self.conn().await?)
            .await;
        let mut entries = Vec::new();
        for id in self.count(ids)? {
            if let Some(entry) = self.registry_get(reg, &id).await? {
                entries.push(entry);
            }
        }
        Ok(entries)
    }

    async fn registry_delete(&self, reg: Registry, id: &str) -> Result<bool, StoreError> {
        let r: Result<(i64, i64), _> = redis::pipe()
            .atomic()
            .del(reg.entry(&self.keys, id))
            .zrem(reg.index(&self.keys), id)
            .query_async(&mut self.conn().await?)
            .await;
        Ok(self.count(r)?.0 > 0)
    }

    /// Writes `tool` if its entry is unchanged since `previous` was read (`None`: only if there is
    /// none); returns whether it was written.
    pub async fn write_tool(&self, tool: &StoredTool, previous: Option<&ToolVersion>) -> Result<bool, StoreError> {
        let json = serde_json::to_string(tool).expect("a tool serialises");
        let r: Result<i64, _> = TOOL_WRITE
            .key(self.keys.tool(&tool.name))
            .key(self.keys.tools_index())
            .key(self.keys.tool_ids())
            .arg(previous.map_or("", |p| p.raw.as_str()))
            .arg(json)
            .arg(&tool.name)
            .arg(&tool.id)
            .arg(previous.map_or("", |p| p.tool.id.as_str()))
            .invoke_async(&mut self.conn().await?)
            .await;
        Ok(self.count(r)? == 1)
    }

    pub async fn get_tool(&self, name: &str) -> Result<Option<StoredTool>, StoreError> {
        Ok(self.read_tool(name).await?.map(|v| v.tool))
    }

    /// A tool with what a conditional write needs.
    pub async fn read_tool(&self, name: &str) -> Result<Option<ToolVersion>, StoreError> {
        let raw: Result<Option<String>, _> = self.conn().await?.get(self.keys.tool(name)).await;
        self.count(raw)?
            .map(|raw| match serde_json::from_str(&raw) {
                Ok(tool) => Ok(ToolVersion { tool, raw }),
                Err(e) => Err(StoreError::Corrupt(format!("tool {name}: {e}"))),
            })
            .transpose()
    }

    /// The name the id index holds for `id` (the caller checks that tool's id: the name may have
    /// been registered again since).
    pub async fn tool_name_by_id(&self, id: &str) -> Result<Option<String>, StoreError> {
        let r: Result<Option<String>, _> = self.conn().await?.hget(self.keys.tool_ids(), id).await;
        self.count(r)
    }

    /// Tools in name order after `after`, at most `limit`.
    pub async fn list_tools(&self, after: Option<&str>, limit: usize) -> Result<Vec<ToolVersion>, StoreError> {
        let min = after.map(|a| format!("({a}")).unwrap_or_else(|| "-".into());
        let names: Result<Vec<String>, _> = redis::cmd("ZRANGEBYLEX")
            .arg(self.keys.tools_index())
            .arg(min)
            .arg("+")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut self.conn().await?)
            .await;
        let mut tools = Vec::new();
        for name in self.count(names)? {
            if let Some(tool) = self.read_tool(&name).await? {
                tools.push(tool);
            }
        }
        Ok(tools)
    }

    /// Deletes the tool named `name` (only if its id is `id`, when given); returns whether it did.
    pub async fn delete_tool(&self, name: &str, id: Option<&str>) -> Result<bool, StoreError> {
        let r: Result<i64, _> = TOOL_DELETE
            .key(self.keys.tool(name))
            .key(self.keys.tools_index())
            .key(self.keys.tool_ids())
            .arg(name)
            .arg(id.unwrap_or(""))
            .invoke_async(&mut self.conn().await?)
            .await;
        Ok(self.count(r)? == 1)
    }

    /// Creates or replaces a webhook; returns whether it is new.
    pub async fn put_webhook(&self, hook: &StoredWebhook) -> Result<bool, StoreError> {
        self.registry_put(Registry::Webhooks, &hook.id, hook).await
    }

    pub async fn get_webhook(&self, id: &str) -> Result<Option<StoredWebhook>, StoreError> {
        self.registry_get(Registry::Webhooks, id).await
    }

    /// Webhooks in id order after `after`, at most `limit`.
    pub async fn list_webhooks(&self, after: Option<&str>, limit: usize) -> Result<Vec<StoredWebhook>, StoreError> {
        self.registry_list(Registry::Webhooks, after, limit).await
    }

    /// Every webhook subscribed to `event`.
    pub async fn subscribers(&self, event: &str) -> Result<Vec<StoredWebhook>, StoreError> {
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self.list_webhooks(after.as_deref(), 200).await?;
            let done = page.len() < 200;
            after = page.last().map(|h| h.id.clone());
            all.extend(page.into_iter().filter(|h| h.events.iter().any(|e| e == event)));
            if done {
                return Ok(all);
            }
        }
    }

    pub async fn delete_webhook(&self, id: &str) -> Result<bool, StoreError> {
        self.registry_delete(Registry::Webhooks, id).await
    }

    // ---- session event streams ----

    /// The id of the newest event in the session's stream (`0-0` if none): where a new reader starts.
    pub async fn last_event_id(&self, session_id: &str) -> Result<String, StoreError> {
        let r: Result<redis::Value, _> = redis::cmd("XREVRANGE")
            .arg(self.keys.session(session_id, "events"))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut self.conn().await?)
            .await;
        let reply: redis::streams::StreamRangeReply = redis::from_redis_value(self.count(r)?).unwrap_or_default();
        Ok(reply.ids.first().map(|e| e.id.clone()).unwrap_or_else(|| "0-0".into()))
    }

    /// Up to 100 events after `after` (a stream id). Never blocks: the connection is shared; a
    /// reader waits for the session's notification (`crate::session_events`) instead.
    pub async fn read_events(&self, session_id: &str, after: &str) -> Result<Vec<(String, String)>, StoreError> {
        let key = self.keys.session(session_id, "events");
        let r: Result<redis::Value, _> = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(100)
            .arg("STREAMS")
            .arg(&key)
            .arg(after)
            .query_async(&mut self.conn().await?)
            .await;
        let reply: Option<redis::streams::StreamReadReply> = match self.count(r)? {
            redis::Value::Nil => None,
            v => redis::from_redis_value(v).ok(),
        };
        Ok(reply
            .into_iter()
            .flat_map(|r| r.keys)
            .flat_map(|k| k.ids)
            .map(|entry| {
                let data = entry.get::<String>("data").unwrap_or_default();
                (entry.id, data)
            })
            .collect())
    }

    // ---- execution records ----

    pub async fn create_execution(&self, e: &NewExecution<'_>) -> Result<(), StoreError> {
        let key = self.keys.execution(e.execution_id);
        let mut fields = vec![
            (field::KIND, e.kind.to_string()),
            (field::STATUS, ExecutionStatus::Queued.as_str().to_string()),
            (field::CREATED_AT_MS, e.now_ms.to_string()),
            (field::UPDATED_AT_MS, e.now_ms.to_string()),
            (field::ATTEMPTS, "0".to_string()),
        ];
        for (name, value) in
            [(field::TOOL_NAME, e.tool_name), (field::ROOM_ID, e.room_id), (field::ASSISTANT_ID, e.assistant_id)]
        {
            if let Some(v) = value {
                fields.push((name, v.to_string()));
            }
        }
        if let Some(due) = e.run_at_ms {
            fields.push((field::RUN_AT_MS, due.to_string()));
        }
        let r: Result<(), _> = redis::pipe()
            .hset_multiple(&key, &fields)
            .ignore()
            .expire(&key, IDEMPOTENCY_TTL_SECS as i64)
            .ignore()
            .query_async(&mut self.conn().await?)
            .await;
        self.count(r)?;
        let waiting_since = e.run_at_ms.unwrap_or(e.now_ms).max(e.now_ms);
        let r: Result<(), _> = self.conn().await?.zadd(self.keys.waiting(e.kind), e.execution_id, waiting_since).await;
        self.count(r)
    }

    /// Marks an execution as started: it no longer counts towards the oldest-waiting-job age.
    pub async fn mark_started(&self, execution_id: &str, kind: &str) -> Result<(), StoreError> {
        let r: Result<(), _> = self.conn().await?.zrem(self.keys.waiting(kind), execution_id).await;
        self.count(r)
    }

    /// The acceptance time (ms) of the oldest job of `kind` not yet started.
    pub async fn oldest_waiting(&self, kind: &str) -> Result<Option<i64>, StoreError> {
        let r: Result<Vec<(String, i64)>, _> = redis::cmd("ZRANGE")
            .arg(self.keys.waiting(kind))
            .arg(0)
            .arg(0)
            .arg("WITHSCORES")
            .query_async(&mut self.conn().await?)
            .await;
        Ok(self.count(r)?.first().map(|(_, at)| *at))
    }

    /// Removes a record whose job was never accepted (the publish failed).
    pub async fn delete_execution(&self, execution_id: &str, kind: &str) -> Result<(), StoreError> {
        let r: Result<(), _> = self.conn().await?.zrem(self.keys.waiting(kind), execution_id).await;
        self.count(r)?;
        let r: Result<(), _> = redis::pipe()
            .del(self.keys.execution(execution_id))
            .ignore()
            .del(self.keys.attempts(execution_id))
            .ignore()
            .query_async(&mut self.conn().await?)
            .await;
        self.count(r)
    }

    /// Sets the status (and, if given, the attempt count) of an execution. With `fence` (the
    /// writer's claim token) the write is refused, returning `false`, once a newer claim wrote.
    pub async fn set_status(
        &self,
        execution_id: &str,
        status: ExecutionStatus,
        attempt: Option<u32>,
        now_ms: i64,
        fence: Option<u64>,
    ) -> Result<bool, StoreError> {
        let mut fields = vec![(field::STATUS, status.as_str().to_string()), (field::UPDATED_AT_MS, now_ms.to_string())];
        if let Some(a) = attempt {
            fields.push((field::ATTEMPTS, a.to_string()));
        }
        self.write_record(execution_id, &fields, None, fence).await
    }

    /// Appends an attempt to the history and sets the execution's status (and result or last
    /// error). With `fence`, refused (`false`) once a newer claim wrote, as `set_status`.
    pub async fn record_attempt(
        &self,
        execution_id: &str,
        attempt: &AttemptRecord,
        status: ExecutionStatus,
        result: Option<&Value>,
        now_ms: i64,
        fence: Option<u64>,
    ) -> Result<bool, StoreError> {
        let mut fields = vec![
            (field::STATUS, status.as_str().to_string()),
            (field::UPDATED_AT_MS, now_ms.to_string()),
            (field::ATTEMPTS, attempt.attempt.to_string()),
        ];
        if let Some(error) = &attempt.error {
            fields.push((field::LAST_ERROR, error.clone()));
        }
        if let Some(result) = result {
            fields.push((field::RESULT, result.to_string()));
        }
        let entry = serde_json::to_string(attempt).expect("an attempt serialises");
        self.write_record(execution_id, &fields, Some(&entry), fence).await
    }

    /// Writes record fields (and appends an attempt entry), fenced by a claim token if given.
    async fn write_record(
        &self,
        execution_id: &str,
        fields: &[(&str, String)],
        attempt: Option<&str>,
        fence: Option<u64>,
    ) -> Result<bool, StoreError> {
        let key = self.keys.execution(execution_id);
        let attempts_key = self.keys.attempts(execution_id);
        let ttl = IDEMPOTENCY_TTL_SECS as i64;
        if let Some(token) = fence {
            let mut invocation = FENCED_RECORD.key(&key);
            invocation.key(&attempts_key).arg(token).arg(ttl).arg(attempt.unwrap_or(""));
            for (name, value) in fields {
                invocation.arg(*name).arg(value);
            }
            let r: Result<i64, _> = invocation.invoke_async(&mut self.conn().await?).await;
            return Ok(self.count(r)? == 1);
        }
        let mut pipe = redis::pipe();
        if let Some(entry) = attempt {
            pipe.rpush(&attempts_key, entry).ignore().expire(&attempts_key, ttl).ignore();
        }
        let r: Result<(), _> = pipe
            .hset_multiple(&key, fields)
            .ignore()
            .expire(&key, ttl)
            .ignore()
            .query_async(&mut self.conn().await?)
            .await;
        self.count(r).map(|_| true)
    }

    /// Marks an execution succeeded with `result` without a new attempt (repair after a crash
    /// between the fenced result write and the record update).
    pub async fn mark_succeeded(&self, execution_id: &str, result: &Value, now_ms: i64) -> Result<(), StoreError> {
        let key = self.keys.execution(execution_id);
        let fields = [
            (field::STATUS, ExecutionStatus::Succeeded.as_str().to_string()),
            (field::UPDATED_AT_MS, now_ms.to_string()),
            (field::RESULT, result.to_string()),
        ];
        let r: Result<(), _> =
            redis::pipe().hset_multiple(&key, &fields).ignore().query_async(&mut self.conn().await?).await;
        self.count(r)
    }

    pub async fn get_execution(&self, execution_id: &str) -> Result<Option<ExecutionView>, StoreError> {
        let r: Result<(std::collections::HashMap<String, String>, Vec<String>), _> = redis::pipe()
            .hgetall(self.keys.execution(execution_id))
            .lrange(self.keys.attempts(execution_id), 0, -1)
            .query_async(&mut self.conn().await?)
            .await;
        let (hash, attempts) = self.count(r)?;
        if hash.is_empty() {
            return Ok(None);
        }
        let corrupt = |what: &str| StoreError::Corrupt(format!("execution {execution_id}: {what}"));
        let num = |name: &str| hash.get(name).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        let status =
            hash.get(field::STATUS).and_then(|s| ExecutionStatus::parse(s)).ok_or_else(|| corrupt("status"))?;
        let result = match hash.get(field::RESULT) {
            Some(raw) => Some(serde_json::from_str(raw).map_err(|_| corrupt("result"))?),
            None => None,
        };
        let attempts = attempts
            .iter()
            .map(|a| serde_json::from_str(a).map_err(|_| corrupt("attempt")))
            .collect::<Result<Vec<AttemptRecord>, _>>()?;
        Ok(Some(ExecutionView {
            execution_id: execution_id.to_string(),
            kind: hash.get(field::KIND).cloned().unwrap_or_default(),
            status,
            tool_name: hash.get(field::TOOL_NAME).cloned(),
            room_id: hash.get(field::ROOM_ID).cloned(),
            assistant_id: hash.get(field::ASSISTANT_ID).cloned(),
            created_at_ms: num(field::CREATED_AT_MS),
            updated_at_ms: num(field::UPDATED_AT_MS),
            run_at_ms: hash.get(field::RUN_AT_MS).and_then(|v| v.parse().ok()),
            result,
            last_error: hash.get(field::LAST_ERROR).cloned(),
            attempts,
        }))
    }

    // ---- idempotency claims ----

    /// Claims `execution_id` for `owner` with a lease of `lease`, atomically.
    pub async fn claim(&self, execution_id: &str, owner: &str, lease: Duration) -> Result<Claim, StoreError> {
        let r: Result<(String, String), _> = CLAIM
            .key(self.keys.idempotency(execution_id))
            .arg(owner)
            .arg(lease.as_millis() as u64)
            .arg(IDEMPOTENCY_TTL_SECS)
            .invoke_async(&mut self.conn().await?)
            .await;
        let (state, detail) = self.count(r)?;
        match state.as_str() {
            "claimed" => {
                Ok(Claim::Acquired { token: detail.parse().map_err(|_| StoreError::Corrupt("token".into()))? })
            }
            "busy" => Ok(Claim::Busy { remaining: Duration::from_millis(detail.parse().unwrap_or(1000)) }),
            "done" => {
                let v: Value = serde_json::from_str(&detail)
                    .map_err(|e| StoreError::Corrupt(format!("idempotency {execution_id}: {e}")))?;
                Ok(Claim::AlreadyDone { result: v.get("result").cloned().unwrap_or(Value::Null) })
            }
            other => Err(StoreError::Corrupt(format!("claim script answered {other}"))),
        }
    }

    /// Runs one of the fenced claim scripts (renew, complete, release), which all take
    /// `token, argument, ttl` and act only if `token` still holds the claim.
    async fn fenced(
        &self,
        script: &Script,
        execution_id: &str,
        token: u64,
        argument: impl redis::ToRedisArgs,
    ) -> Result<bool, StoreError> {
        Ok(self.fenced_code(script, execution_id, token, argument).await? == 1)
    }

    /// `fenced`'s script's own answer (0: fenced off).
    async fn fenced_code(
        &self,
        script: &Script,
        execution_id: &str,
        token: u64,
        argument: impl redis::ToRedisArgs,
    ) -> Result<i64, StoreError> {
        let r: Result<i64, _> = script
            .key(self.keys.idempotency(execution_id))
            .arg(token)
            .arg(argument)
            .arg(IDEMPOTENCY_TTL_SECS)
            .invoke_async(&mut self.conn().await?)
            .await;
        self.count(r)
    }

    /// Extends the lease if `token` still holds it.
    pub async fn renew(&self, execution_id: &str, token: u64, lease: Duration) -> Result<bool, StoreError> {
        self.fenced(&RENEW, execution_id, token, lease.as_millis() as u64).await
    }

    /// Stores the final result if `token` still holds the claim, or if the claim is gone (lost in
    /// a Redis failover: nobody else holds it); `false` means a newer claim fenced this writer off
    /// and nothing was written.
    pub async fn complete(&self, execution_id: &str, token: u64, result: &Value) -> Result<bool, StoreError> {
        match self.fenced_code(&COMPLETE, execution_id, token, result.to_string()).await? {
            2 => {
                tracing::warn!(execution_id, "the claim was gone (lost in a Redis failover?); result stored anyway");
                Ok(true)
            }
            code => Ok(code == 1),
        }
    }

    /// Marks a claim done whoever held it: a steer's step, answered by the turn it steered into.
    pub async fn force_done(&self, execution_id: &str, result: &Value) -> Result<(), StoreError> {
        let done = format!(r#"{{"state":"done","token":0,"result":{result}}}"#);
        let r: Result<(), _> =
            self.conn().await?.set_ex(self.keys.idempotency(execution_id), done, IDEMPOTENCY_TTL_SECS).await;
        self.count(r)
    }

    /// Gives up the claim after a failed attempt so the next attempt can claim at once.
    /// `state` says why (`released`, `dead_lettered`).
    pub async fn release(&self, execution_id: &str, token: u64, state: &str) -> Result<bool, StoreError> {
        self.fenced(&RELEASE, execution_id, token, state).await
    }

    // ---- client Idempotency-Key ----

    /// Reserves `key` for a request with `body_digest`: a new key goes to `execution_id`, pending
    /// for `pending_for` (then a crashed request's reservation is abandoned); an existing one is
    /// decided by `idempotency::decide`. Times are this process's clock.
    pub async fn reserve_request(
        &self,
        key: &str,
        execution_id: &str,
        body_digest: &str,
        pending_for: Duration,
    ) -> Result<Reservation, StoreError> {
        // Two requests racing to take over one abandoned key: the loser sees the winner's hold.
        for _ in 0..3 {
            let now = crate::now_ms();
            let until = now + pending_for.as_millis() as i64;
            let fresh = RequestRecord::pending(execution_id, body_digest, until, rand::random());
            let raw = fresh.to_json();
            let r: Result<(Option<String>, String), _> = redis::pipe()
                .cmd("SET")
                .arg(key)
                .arg(&raw)
                .arg("NX")
                .arg("EX")
                .arg(IDEMPOTENCY_TTL_SECS)
                .get(key)
                .query_async(&mut self.conn().await?)
                .await;
            let (set, current) = self.count(r)?;
            if set.is_some() {
                return Ok(Reservation::New(RequestHold { key: key.into(), raw, record: fresh }));
            }
            let stored = RequestRecord::parse(&current).map_err(StoreError::Corrupt)?;
            match decide(&stored, body_digest, now) {
                Decision::Replay(id) => return Ok(Reservation::Existing(id)),
                Decision::InProgress => return Ok(Reservation::InProgress),
                Decision::Reused => return Ok(Reservation::Reused),
                Decision::Republish(_) => {
                    let record = stored.with_state(RequestState::Pending, until, rand::random());
                    let hold = RequestHold { key: key.into(), raw: record.to_json(), record };
                    if self.swap_request(key, &current, Some(&hold.raw)).await? {
                        return Ok(Reservation::Unconfirmed(hold));
                    }
                }
            }
        }
        Ok(Reservation::InProgress)
    }

    async fn swap_request(&self, key: &str, expected: &str, new: Option<&str>) -> Result<bool, StoreError> {
        let r: Result<i64, _> = SWAP
            .key(key)
            .arg(expected)
            .arg(new.unwrap_or(""))
            .arg(IDEMPOTENCY_TTL_SECS)
            .invoke_async(&mut self.conn().await?)
            .await;
        Ok(self.count(r)? == 1)
    }

    /// The broker confirmed the held execution: the key answers it for 7 days.
    pub async fn confirm_request(&self, hold: &RequestHold) -> Result<(), StoreError> {
        let record = hold.record.with_state(RequestState::Confirmed, 0, hold.record.hold);
        let r: Result<(), _> = self.conn().await?.set_ex(&hold.key, record.to_json(), IDEMPOTENCY_TTL_SECS).await;
        self.count(r)
    }

    /// The held execution was certainly not sent: the key is free again, unless another request
    /// took it over meanwhile (then `false`).
    pub async fn release_request(&self, hold: &RequestHold) -> Result<bool, StoreError> {
        self.swap_request(&hold.key, &hold.raw, None).await
    }

    /// A batch accepted in part: the indices of its jobs the broker confirmed, kept beside its key
    /// so that a retry with the key publishes only the others.
    pub async fn note_batch_confirmed(&self, hold: &RequestHold, indices: &[usize]) -> Result<(), StoreError> {
        let key = format!("{}:confirmed", hold.key);
        let mut pipe = redis::pipe();
        if !indices.is_empty() {
            pipe.sadd(&key, indices).ignore();
        }
        let r: Result<(), _> =
            pipe.expire(&key, IDEMPOTENCY_TTL_SECS as i64).ignore().query_async(&mut self.conn().await?).await;
        self.count(r)
    }

    /// The indices `note_batch_confirmed` kept for the batch `hold` takes over (empty if none).
    pub async fn batch_confirmed(&self, hold: &RequestHold) -> Result<std::collections::HashSet<usize>, StoreError> {
        let r: Result<std::collections::HashSet<usize>, _> =
            self.conn().await?.smembers(format!("{}:confirmed", hold.key)).await;
        self.count(r)
    }

    /// The held execution may or may not be on the queue: the key keeps naming it, and the next
    /// request with it publishes it again at once instead of waiting for the reservation to expire.
    pub async fn abandon_request(&self, hold: &RequestHold) -> Result<(), StoreError> {
        let record = hold.record.with_state(RequestState::Unconfirmed, 0, hold.record.hold);
        self.swap_request(&hold.key, &hold.raw, Some(&record.to_json())).await.map(|_| ())
    }
}
