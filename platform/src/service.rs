//! One way to run a process of the fleet: configuration loaded once, its TLS checked, telemetry
//! started, the process run under one [`Lifetime`] until a signal, then telemetry flushed.

use std::fmt::Display;
use std::future::Future;
use std::process::ExitCode;

use crate::config::{CommonConfig, ConfigError, Source};
use crate::shutdown::{cancel_on_signal, Lifetime};

/// A process's typed configuration.
pub trait ServiceConfig: Sized {
    fn load(src: &Source) -> Result<Self, ConfigError>;
    fn common(&self) -> &CommonConfig;
}

/// Runs `body` as the process `name`: exit code 2 for a configuration the process refuses
/// (including a certificate), 1 when `body` fails, 0 after a clean shutdown.
pub async fn main<C, E, F, Fut>(name: &'static str, body: F) -> ExitCode
where
    C: ServiceConfig,
    E: Display,
    F: FnOnce(C, Lifetime) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let config = match Source::from_env().and_then(|src| C::load(&src)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{name}: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) =
        crate::tls::startup_check(&config.common().amqp_urls, &config.common().redis_url, &config.common().tls).await
    {
        eprintln!("{name}: {e}");
        return ExitCode::from(2);
    }
    let common = config.common();
    let telemetry = crate::telemetry::init(common.log_format, name, &common.tls);
    let lifetime = Lifetime::new();
    let signals = tokio::spawn(cancel_on_signal(lifetime.intake()));
    let result = body(config, lifetime.clone()).await;
    lifetime.end();
    let _ = signals.await;
    // Flushing exported spans blocks; keep it off the async workers.
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    match result {
        Ok(()) => {
            tracing::info!("{name} stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "{name} failed");
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The process's Redis, as its configuration names it.
pub fn open_store(
    common: &CommonConfig,
    metrics: crate::metrics::Metrics,
) -> Result<crate::store::Store, crate::store::StoreError> {
    Ok(crate::store::Store::open(&common.redis_url, common.keys.clone(), common.redis_timeout, metrics, &common.tls)?
        .with_dead_letter_retention(common.dead_letter_retention)
        .with_execution_index_retention(common.execution_index_retention))
}

/// The process's broker link and the supervisor task that keeps it live until `cancel`.
pub fn supervise_broker(
    common: &CommonConfig,
    metrics: crate::metrics::Metrics,
    cancel: tokio_util::sync::CancellationToken,
) -> (crate::broker::BrokerLink, impl Future<Output = ()>) {
    crate::broker::supervise(
        common.amqp_urls.clone(),
        common.tls.clone(),
        common.topology.clone(),
        common.publish_timeout,
        metrics,
        cancel,
    )
}
