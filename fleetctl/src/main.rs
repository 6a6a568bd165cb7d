//! `fleetctl`: the operator's CLI. Declares the topology, shows queue depths, and inspects dead
//! letters. It reads the same `FLEET_*` settings as the other processes and talks to RabbitMQ and
//! Redis directly.

use anyhow::Context;
use clap::{Parser, Subcommand};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use serde_json::json;

use fleet_platform::config::{CommonConfig, Source};
use fleet_platform::metrics::Metrics;
use fleet_platform::store::Store;

#[derive(Parser)]
#[command(name = "fleetctl", version, about = "Operate the agent job fleet: topology, queues, dead letters")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Topology operations.
    Topology {
        #[command(subcommand)]
        action: TopologyAction,
    },
    /// Messages and consumers on every fleet queue.
    Queues,
    /// Dead-letter operations.
    #[command(name = "dead-letters")]
    DeadLetters {
        #[command(subcommand)]
        action: DeadLetterAction,
    },
}

#[derive(Subcommand)]
enum TopologyAction {
    /// Declare every exchange, queue and binding (idempotent).
    Declare,
    /// Print the topology's names and arguments.
    Show,
}

#[derive(Subcommand)]
enum DeadLetterAction {
    /// List dead letters, newest first.
    List {
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Show one dead letter's record and attempt history.
    Show { execution_id: String },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let src = Source::from_env()?;
    let config = CommonConfig::load(&src)?;
    match cli.command {
        Command::Topology { action: TopologyAction::Show } => {
            for q in config.topology.queues() {
                println!("queue {} {:?}", q.name, q.arguments);
            }
            for e in config.topology.exchanges() {
                println!("exchange {} {:?}", e.name, e.kind);
            }
        }
        Command::Topology { action: TopologyAction::Declare } => {
            let conn = fleet_platform::broker::connect(&config.amqp_url).await.context("connecting to RabbitMQ")?;
            let channel = conn.create_channel().await?;
            fleet_platform::broker::declare_topology(&channel, &config.topology).await?;
            println!(
                "declared {} queues and {} exchanges with prefix {:?}",
                config.topology.queues().len(),
                config.topology.exchanges().len(),
                config.topology.prefix()
            );
            let _ = conn.close(200, "done".into()).await;
        }
        Command::Queues => {
            let conn = fleet_platform::broker::connect(&config.amqp_url).await.context("connecting to RabbitMQ")?;
            println!("{:<48} {:>10} {:>10}", "queue", "messages", "consumers");
            for q in config.topology.queues() {
                let channel = conn.create_channel().await?;
                let options = QueueDeclareOptions { passive: true, ..Default::default() };
                match channel.queue_declare(q.name.as_str().into(), options, FieldTable::default()).await {
                    Ok(info) => println!("{:<48} {:>10} {:>10}", q.name, info.message_count(), info.consumer_count()),
                    Err(_) => println!("{:<48} {:>10} {:>10}", q.name, "missing", "-"),
                }
            }
            let _ = conn.close(200, "done".into()).await;
        }
        Command::DeadLetters { action } => {
            let store =
                Store::open(&config.redis_url, config.keys.clone(), config.redis_timeout, Metrics::new("fleetctl"))?;
            match action {
                DeadLetterAction::List { limit } => {
                    for (id, _) in store.list_dead_letters(None, limit).await? {
                        if let Some(r) = store.get_dead_letter(&id).await? {
                            println!(
                                "{}",
                                json!({"execution_id": id, "tool_name": r.tool_name, "reason": r.reason, "attempts": r.attempts,
                                       "last_error": r.last_error, "dead_lettered_at": r.dead_lettered_at})
                            );
                        }
                    }
                }
                DeadLetterAction::Show { execution_id } => match store.get_dead_letter(&execution_id).await? {
                    Some(r) => println!("{}", serde_json::to_string_pretty(&r)?),
                    None => anyhow::bail!("no dead letter for {execution_id}"),
                },
            }
        }
    }
    Ok(())
}
