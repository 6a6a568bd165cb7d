//! `fleetctl topology declare|show` and `fleetctl queues`: the broker side.

use anyhow::Context;
use clap::Subcommand;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use fleet_platform::config::CommonConfig;

#[derive(Subcommand)]
pub(crate) enum TopologyAction {
    /// Declare every exchange, queue and binding (idempotent).
    Declare,
    /// Print the topology's names and arguments.
    Show,
}

pub(crate) async fn run(config: &CommonConfig, action: TopologyAction) -> anyhow::Result<()> {
    match action {
        TopologyAction::Show => {
            for q in config.topology.queues() {
                println!("queue {} {:?}", q.name, q.arguments);
            }
            for e in config.topology.exchanges() {
                println!("exchange {} {:?}", e.name, e.kind);
            }
        }
        TopologyAction::Declare => {
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
    }
    Ok(())
}

/// Messages and consumers on every fleet queue (`missing` for one not declared).
pub(crate) async fn queues(config: &CommonConfig) -> anyhow::Result<()> {
    let (conn, _) =
        fleet_platform::broker::connect(&config.amqp_urls, &config.tls).await.context("connecting to RabbitMQ")?;
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
    Ok(())
}
