//! `fleetctl`: the operator's CLI. Declares the topology, shows queue depths, inspects dead
//! letters, and shows or closes a tool's circuit. It reads the same `FLEET_*` settings as the other processes and talks to RabbitMQ and
//! Redis directly.

use anyhow::Context;
use clap::{Parser, Subcommand};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use serde_json::json;

use fleet_platform::config::{CommonConfig, Source};
use fleet_platform::dead_letters::{self, Action, SweepReport};
use fleet_platform::metrics::Metrics;
use fleet_platform::store::Store;
use fleet_protocol::deadletter::DeadLetterFilter;

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
    /// A tool's circuit (endpoint health).
    Circuit {
        #[command(subcommand)]
        action: CircuitAction,
    },
}

#[derive(Subcommand)]
enum CircuitAction {
    /// Show a tool's endpoint health and circuit state.
    Show { tool: String },
    /// Close a tool's circuit by hand: its consecutive failures reset and its deferred calls run
    /// when they next come back from the delay queue.
    Close { tool: String },
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
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Show one dead letter's record and attempt history.
    Show { execution_id: String },
    /// Put dead letters back on the work queue (fresh attempt count, same execution id). A job
    /// that already succeeded is not run again.
    Retry {
        /// Execution ids to retry; none with --all means every match of the filters.
        ids: Vec<String>,
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        filter: FilterArgs,
        /// Redrive rate, jobs per second.
        #[arg(long, default_value_t = 50.0)]
        rate: f64,
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Delete dead letters (by id, or every match of the filters with --all) and print the count.
    Purge {
        ids: Vec<String>,
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        filter: FilterArgs,
        /// Required: purging cannot be undone.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(clap::Args)]
struct FilterArgs {
    /// Only dead letters of this tool.
    #[arg(long)]
    tool: Option<String>,
    /// Only this reason: exhausted, permanent, poison, delivery_limit.
    #[arg(long)]
    reason: Option<String>,
    /// Only dead-lettered at or after this RFC 3339 time.
    #[arg(long)]
    since: Option<String>,
    /// Only dead-lettered before this RFC 3339 time.
    #[arg(long)]
    until: Option<String>,
}

impl FilterArgs {
    fn into_filter(self, ids: Vec<String>, all: bool) -> anyhow::Result<DeadLetterFilter> {
        if ids.is_empty() && !all {
            anyhow::bail!("name execution ids, or pass --all to act on every dead letter matching the filters");
        }
        let reason = match self.reason {
            Some(r) => Some(serde_json::from_value(json!(r)).map_err(|_| anyhow::anyhow!("unknown reason {r:?}"))?),
            None => None,
        };
        let filter =
            DeadLetterFilter { execution_ids: ids, tool_name: self.tool, reason, since: self.since, until: self.until };
        filter.validate().map_err(|field| anyhow::anyhow!("--{field} must be an RFC 3339 timestamp"))?;
        Ok(filter)
    }
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
            let (conn, _) = fleet_platform::broker::connect(&config.amqp_urls, &config.tls)
                .await
                .context("connecting to RabbitMQ")?;
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
            let (conn, _) = fleet_platform::broker::connect(&config.amqp_urls, &config.tls)
                .await
                .context("connecting to RabbitMQ")?;
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
        Command::Circuit { action } => circuit(&config, action).await?,
        Command::DeadLetters { action } => {
            let store = Store::open(
                &config.redis_url,
                config.keys.clone(),
                config.redis_timeout,
                Metrics::new("fleetctl"),
                &config.tls,
            )?
            .with_dead_letter_retention(config.dead_letter_retention);
            match action {
                DeadLetterAction::List { limit, filter } => {
                    let filter = filter.into_filter(vec![], true)?;
                    let mut cursor = None;
                    let mut shown = 0;
                    while shown < limit {
                        let (records, next) =
                            dead_letters::list(&store, &filter, cursor, limit - shown, 10_000).await?;
                        for r in records {
                            shown += 1;
                            println!(
                                "{}",
                                json!({"execution_id": r.execution_id, "tool_name": r.tool_name, "reason": r.reason,
                                       "attempts": r.attempts, "last_error": r.last_error,
                                       "dead_lettered_at": r.dead_lettered_at})
                            );
                        }
                        match next {
                            Some(next) => cursor = Some(next),
                            None => break,
                        }
                    }
                }
                DeadLetterAction::Show { execution_id } => match store.get_dead_letter(&execution_id).await? {
                    Some(r) => println!("{}", serde_json::to_string_pretty(&r)?),
                    None => anyhow::bail!("no dead letter for {execution_id}"),
                },
                DeadLetterAction::Retry { ids, all, filter, rate, limit } => {
                    let filter = filter.into_filter(ids, all)?;
                    let report = redrive(&config, &store, &filter, limit, rate).await?;
                    println!("{}", serde_json::to_string(&report)?);
                }
                DeadLetterAction::Purge { ids, all, filter, yes } => {
                    if !yes {
                        anyhow::bail!("purging cannot be undone: pass --yes");
                    }
                    let filter = filter.into_filter(ids, all)?;
                    let report = dead_letters::apply(&store, None, &filter, Action::Delete, None, None).await?;
                    println!("purged {} dead letter(s) ({} scanned)", report.done, report.scanned);
                }
            }
        }
    }
    Ok(())
}

async fn circuit(config: &CommonConfig, action: CircuitAction) -> anyhow::Result<()> {
    let store = Store::open(
        &config.redis_url,
        config.keys.clone(),
        config.redis_timeout,
        Metrics::new("fleetctl"),
        &config.tls,
    )?;
    let time = |ms: Option<i64>| ms.map(fleet_protocol::timefmt::rfc3339_from_millis);
    match action {
        CircuitAction::Show { tool } => {
            let h = store.tool_health(&tool).await?;
            println!(
                "{}",
                json!({"tool": tool, "state": if h.open { "open" } else { "closed" },
                       "consecutive_failures": h.consecutive_failures, "last_success_at": time(h.last_success_ms),
                       "last_failure_at": time(h.last_failure_ms), "opened_at": time(h.opened_at_ms)})
            );
        }
        CircuitAction::Close { tool } => {
            let was_open = store.close_circuit(&tool, fleet_platform::now_ms()).await?;
            let what = if was_open { "closed" } else { "was not open; failures reset" };
            println!("circuit of tool {tool:?} {what}");
        }
    }
    Ok(())
}

async fn redrive(
    config: &CommonConfig,
    store: &Store,
    filter: &DeadLetterFilter,
    limit: Option<u64>,
    per_second: f64,
) -> anyhow::Result<SweepReport> {
    let (conn, _) =
        fleet_platform::broker::connect(&config.amqp_urls, &config.tls).await.context("connecting to RabbitMQ")?;
    let conn = std::sync::Arc::new(conn);
    let publisher = fleet_platform::broker::Publisher::open(conn.clone(), config.publish_timeout).await?;
    let redrive = dead_letters::Redrive { publisher: &publisher, topology: &config.topology };
    let report = dead_letters::apply(store, Some(&redrive), filter, Action::Retry, limit, Some(per_second)).await;
    let _ = conn.close(200, "done".into()).await;
    Ok(report?)
}
