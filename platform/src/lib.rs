//! The fleet's shared edges: configuration, the RabbitMQ and Redis adapters, metrics, logging and
//! shutdown. Decisions live in `fleet-protocol`; this crate only moves bytes.

pub mod acks;
pub mod artifacts;
pub mod broker;
pub mod config;
pub mod data_sources;
pub mod dead_letters;
pub mod mcp;
pub mod metrics;
pub mod ops;
pub mod service;
pub mod shutdown;
pub mod source;
pub mod store;
pub mod telemetry;
pub mod tls;

/// Milliseconds since the Unix epoch, from the system clock.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}
