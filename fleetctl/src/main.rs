//! `fleetctl`: the operator's CLI. Declares the topology, shows queue depths, inspects dead
//! letters, and shows or closes a tool's circuit. It reads the same `FLEET_*` settings as the
//! other processes and talks to RabbitMQ and Redis directly. `fleetctl probe` is the container
//! image's health check. One module per subcommand; `run` picks it.

mod circuit;
mod dead_letters;
mod mcp;
mod probe;
mod topology;

use clap::{Parser, Subcommand};

use fleet_platform::config::{CommonConfig, Source};
use fleet_platform::metrics::Metrics;
use fleet_platform::store::Store;

#[derive(Parser)]
#[command(name = "fleetctl", version, about = "Operate the agent job fleet: topology, queues, dead letters, circuits")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Topology operations.
    Topology {
        #[command(subcommand)]
        action: topology::TopologyAction,
    },
    /// Messages and consumers on every fleet queue.
    Queues,
    /// Dead-letter operations.
    #[command(name = "dead-letters")]
    DeadLetters {
        #[command(subcommand)]
        action: dead_letters::DeadLetterAction,
    },
    /// A tool's circuit (endpoint health).
    Circuit {
        #[command(subcommand)]
        action: circuit::CircuitAction,
    },
    /// Health check of a dispatcher or worker on this host (a container's HEALTHCHECK): exits 0
    /// when its /readyz (or --path) answers 2xx.
    Probe(probe::ProbeArgs),
    /// An MCP server's tools, through the fleet's MCP client: list them, call one.
    Mcp {
        #[command(subcommand)]
        action: mcp::McpAction,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    run(Cli::parse()).await
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let src = Source::from_env()?;
    // A health check needs only the process's listen address, not a valid broker or Redis setting.
    let config = match cli.command {
        Command::Probe(args) => return probe::run(&src, args).await,
        // An MCP server is reached directly: no broker or Redis setting is needed.
        Command::Mcp { action } => return mcp::run(action).await,
        _ => CommonConfig::load(&src)?,
    };
    match cli.command {
        Command::Probe(_) | Command::Mcp { .. } => unreachable!("answered above"),
        Command::Topology { action } => topology::run(&config, action).await,
        Command::Queues => topology::queues(&config).await,
        Command::Circuit { action } => circuit::run(&config, action).await,
        Command::DeadLetters { action } => dead_letters::run(&config, action).await,
    }
}

/// Writes one change to the operators' audit log (who: `fleetctl` and the local user); a failed
/// write is reported, not the change's failure (it is made already).
/// Who `fleetctl` acts as: the audit log's and a circuit history's `fleetctl:<user>`.
pub(crate) fn actor() -> String {
    format!("fleetctl:{}", std::env::var("USER").unwrap_or_else(|_| "unknown".into()))
}

pub(crate) async fn audit(store: &Store, action: &str, target: &str, count: u64, detail: &serde_json::Value) {
    let actor = actor();
    let event = fleet_platform::store::AuditEvent {
        actor: &actor,
        via: "fleetctl",
        action,
        target,
        count,
        detail: Some(detail),
    };
    if let Err(e) = store.audit().record(&event).await {
        eprintln!("warning: the audit log was not written: {e}");
    }
}

/// The fleet's Redis store, as the processes open it.
fn store(config: &CommonConfig) -> anyhow::Result<Store> {
    Ok(fleet_platform::service::open_store(config, Metrics::new("fleetctl"))?)
}
