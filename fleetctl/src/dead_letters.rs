//! `fleetctl dead-letters list|show|retry|purge`: the dead-letter runbook's commands.

use anyhow::Context;
use clap::Subcommand;
use serde_json::json;

use fleet_platform::config::CommonConfig;
use fleet_platform::dead_letters::{self, Action, SweepReport};
use fleet_platform::store::Store;
use fleet_protocol::dead_letters::DeadLetterFilter;

#[derive(Subcommand)]
pub(crate) enum DeadLetterAction {
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
pub(crate) struct FilterArgs {
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

pub(crate) async fn run(config: &CommonConfig, action: DeadLetterAction) -> anyhow::Result<()> {
    let store = crate::store(config)?;
    match action {
        DeadLetterAction::List { limit, filter } => list(&store, limit, filter.into_filter(vec![], true)?).await?,
        DeadLetterAction::Show { execution_id } => match store.dead_letters().get_dead_letter(&execution_id).await? {
            Some(r) => println!("{}", serde_json::to_string_pretty(&r)?),
            None => anyhow::bail!("no dead letter for {execution_id}"),
        },
        DeadLetterAction::Retry { ids, all, filter, rate, limit } => {
            let filter = filter.into_filter(ids, all)?;
            let report = redrive(config, &store, &filter, limit, rate).await?;
            crate::audit(&store, "dead_letters.redrive", &filter.describe(), report.done, &json!(report)).await;
            println!("{}", serde_json::to_string(&report)?);
        }
        DeadLetterAction::Purge { ids, all, filter, yes } => {
            if !yes {
                anyhow::bail!("purging cannot be undone: pass --yes");
            }
            let filter = filter.into_filter(ids, all)?;
            let report = dead_letters::apply(&store, None, &filter, Action::Delete, None, None).await?;
            crate::audit(&store, "dead_letters.purge", &filter.describe(), report.done, &json!(report)).await;
            println!("purged {} dead letter(s) ({} scanned)", report.done, report.scanned);
        }
    }
    Ok(())
}

/// Up to `limit` dead letters matching `filter`, newest first, one JSON line each.
async fn list(store: &Store, limit: usize, filter: DeadLetterFilter) -> anyhow::Result<()> {
    let mut cursor = None;
    let mut shown = 0;
    while shown < limit {
        let (records, next) = dead_letters::list(store, &filter, cursor, limit - shown, 10_000).await?;
        for r in records {
            shown += 1;
            println!(
                "{}",
                json!({"execution_id": r.execution_id, "tool_name": r.tool_name, "reason": r.reason,
                       "attempts": r.attempts, "last_error": r.last_error, "dead_lettered_at": r.dead_lettered_at})
            );
        }
        match next {
            Some(next) => cursor = Some(next),
            None => break,
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
