//! Redis, as typed stores, one per concern: each owns its keys (named by `fleet_protocol::keys`)
//! and its Lua scripts (`.lua` files beside it, every key passed as `KEYS`). `Store` opens the one
//! connection and hands out the stores; a caller holds the store it needs.
//!
//! Every Lua script touches keys of one hash slot only (one key, or keys sharing a `{hash tag}`),
//! so every operation works on Redis Cluster as well.

use std::time::Duration;

use fleet_protocol::dead_letters::Retention;
use fleet_protocol::keys::Keys;

use crate::metrics::Metrics;
use crate::tls::ClientTls;

mod approvals;
mod audit;
mod client;
mod connection;
mod console;
mod dead_letters;
mod executions;
mod limits;
mod registry;
pub(crate) mod scan;
mod script;
mod sessions;

pub use approvals::{Approvals, DecideWrite, StoredApproval};
pub use audit::{is_cursor, Audit, AuditEntry, AuditEvent, AUDIT_MAX_ENTRIES};
pub(crate) use client::sends_at_once;
pub use client::Redis;
pub use console::{default_index_retention, ActivityReport, ConsoleIndex, ExecutionFilter};
pub use dead_letters::DeadLetters;
pub use executions::{
    record_ttl_secs, AdmitMode, Begin, CancelRequest, ClaimAfter, Created, Delivery, DeliveryClaim, ExecutionView,
    Executions, Expected, Fence, NewExecution, RequestHold, Reservation, Transition, PARK_SLACK,
};
pub use limits::{
    CircuitAdmission, CircuitChange, CircuitEvent, Limits, Pace, Semaphore, SlotGrant, Spend, ToolHealth, Waiter,
    CIRCUIT_HISTORY_MAX,
};
pub use registry::{
    AssistantVersion, AssistantWrite, ConnectionStatus, DataSourceVersion, Registry, RegistryPage, RoomVersion,
    SchemaStatus, SourceUpdate, StoredDataSource, StoredMcpServer, StoredTool, StoredWebhook, ToolVersion,
};
pub use sessions::{
    CompactHistory, Opened, RoundReport, RoundState, SessionEventSubscription, SessionFinish, SessionHolders,
    SessionSlot, Sessions, MAX_LOGGED_MESSAGES,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis unavailable: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("stored value is corrupt: {0}")]
    Corrupt(String),
}

/// The opened connection and the typed stores over it, built once per process; cloning it is
/// cheap (each store is a handle on the one connection).
#[derive(Clone)]
pub struct Store {
    redis: Redis,
    executions: Executions,
    sessions: Sessions,
    registry: Registry,
    dead_letters: DeadLetters,
    limits: Limits,
    console: ConsoleIndex,
    audit: Audit,
    approvals: Approvals,
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
        Ok(Self::over(Redis::open(url, tls, timeout, (keys, metrics))?))
    }

    fn over(redis: Redis) -> Self {
        Self::assemble(redis, Retention::default(), default_index_retention())
    }

    /// The stores over `redis`, each given the stores it reads beside its own.
    fn assemble(redis: Redis, dead_letters: Retention, index: Retention) -> Self {
        let console = ConsoleIndex { redis: redis.clone(), retention: index };
        let executions = Executions { redis: redis.clone(), index: console.clone() };
        Store {
            sessions: Sessions { redis: redis.clone(), executions: executions.clone() },
            registry: Registry { redis: redis.clone() },
            dead_letters: DeadLetters { redis: redis.clone(), executions: executions.clone(), retention: dead_letters },
            limits: Limits { redis: redis.clone() },
            audit: Audit { redis: redis.clone() },
            approvals: Approvals { redis: redis.clone() },
            executions,
            console,
            redis,
        }
    }

    /// How long and how many dead letters are kept (default: 30 days, 100,000).
    pub fn with_dead_letter_retention(self, retention: Retention) -> Self {
        Self::assemble(self.redis, retention, self.console.retention)
    }

    /// How long and how many entries the executions index keeps.
    pub fn with_execution_index_retention(self, retention: Retention) -> Self {
        Self::assemble(self.redis, self.dead_letters.retention, retention)
    }

    /// The connection itself: pings and server settings.
    pub fn redis(&self) -> &Redis {
        &self.redis
    }

    pub fn keys(&self) -> &Keys {
        self.redis.keys()
    }

    pub fn executions(&self) -> &Executions {
        &self.executions
    }

    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn dead_letters(&self) -> &DeadLetters {
        &self.dead_letters
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn console(&self) -> &ConsoleIndex {
        &self.console
    }

    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    pub fn approvals(&self) -> &Approvals {
        &self.approvals
    }
}
