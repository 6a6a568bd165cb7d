//! `dispatcher`: loads configuration, then serves the fleet's HTTP API until SIGTERM;
//! `dispatcher --print-openapi` prints the API's OpenAPI document instead.

use fleet_dispatcher::DispatcherConfig;
use fleet_platform::config::Source;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The API's contract, as `docs/openapi.json` holds it (no configuration needed).
    if std::env::args().nth(1).as_deref() == Some("--print-openapi") {
        print!("{}", fleet_dispatcher::openapi_text());
        return Ok(());
    }
    let config = match Source::from_env().and_then(|src| DispatcherConfig::load(&src)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("dispatcher: {e}");
            std::process::exit(2);
        }
    };
    // A certificate a TLS service refuses (or that is refused) is a configuration error too.
    if let Err(e) = fleet_platform::tls::startup_check(&config.common).await {
        eprintln!("dispatcher: {e}");
        std::process::exit(2);
    }
    let telemetry = fleet_platform::telemetry::init(config.common.log_format, "dispatcher");
    let cancel = CancellationToken::new();
    let signals = tokio::spawn(fleet_platform::shutdown::cancel_on_signal(cancel.clone()));
    let result = fleet_dispatcher::run(config, cancel.clone()).await;
    cancel.cancel();
    signals.await?;
    // Flushing exported spans blocks; keep it off the async workers.
    tokio::task::spawn_blocking(move || telemetry.shutdown()).await?;
    result?;
    tracing::info!("dispatcher stopped");
    Ok(())
}
