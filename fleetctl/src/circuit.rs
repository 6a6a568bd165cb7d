//! `fleetctl circuit show|close`: a tool's endpoint health.

use clap::Subcommand;
use serde_json::json;

use fleet_platform::config::CommonConfig;

#[derive(Subcommand)]
pub(crate) enum CircuitAction {
    /// Show a tool's endpoint health and circuit state.
    Show { tool: String },
    /// Close a tool's circuit by hand: its consecutive failures reset and its deferred calls run
    /// when they next come back from the delay queue.
    Close { tool: String },
}

pub(crate) async fn run(config: &CommonConfig, action: CircuitAction) -> anyhow::Result<()> {
    let store = crate::store(config)?;
    let time = |ms: Option<i64>| ms.map(fleet_protocol::timefmt::rfc3339_from_millis);
    match action {
        CircuitAction::Show { tool } => {
            let h = store.limits().tool_health(&tool).await?;
            println!(
                "{}",
                json!({"tool": tool, "state": if h.open { "open" } else { "closed" },
                       "consecutive_failures": h.consecutive_failures, "last_success_at": time(h.last_success_ms),
                       "last_failure_at": time(h.last_failure_ms), "opened_at": time(h.opened_at_ms)})
            );
        }
        CircuitAction::Close { tool } => {
            let was_open = store.limits().close_circuit(&tool, fleet_platform::now_ms(), &crate::actor()).await?;
            crate::audit(&store, "circuit.close", &tool, u64::from(was_open), &json!({"was_open": was_open})).await;
            let what = if was_open { "closed" } else { "was not open; failures reset" };
            println!("circuit of tool {tool:?} {what}");
        }
    }
    Ok(())
}
