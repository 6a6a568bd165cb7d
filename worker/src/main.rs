//! `worker`: loads configuration, then consumes jobs until SIGTERM, draining within the grace period.

use fleet_platform::config::Source;
use fleet_worker::WorkerConfig;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = match Source::from_env().and_then(|src| WorkerConfig::load(&src)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("worker: {e}");
            std::process::exit(2);
        }
    };
    // A certificate a TLS service refuses (or that is refused) is a configuration error too.
    if let Err(e) = fleet_platform::tls::startup_check(&config.common).await {
        eprintln!("worker: {e}");
        std::process::exit(2);
    }
    let telemetry = fleet_platform::telemetry::init(config.common.log_format, "worker");
    let cancel = CancellationToken::new();
    let signals = tokio::spawn(fleet_platform::shutdown::cancel_on_signal(cancel.clone()));
    let result = fleet_worker::run(config, cancel.clone()).await;
    cancel.cancel();
    signals.await?;
    // Flushing exported spans blocks; keep it off the async workers.
    tokio::task::spawn_blocking(move || telemetry.shutdown()).await?;
    result?;
    Ok(())
}
