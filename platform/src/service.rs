//! One way to run a process of the fleet: configuration loaded once, its TLS checked, telemetry
//! started, the process run under one [`Lifetime`] until a signal, then telemetry flushed; and
//! one way to open what every long-running process runs on ([`Process`]).

use std::fmt::Display;
use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::broker::BrokerLink;
use crate::config::{CommonConfig, ConfigError, Source};
use crate::metrics::Metrics;
use crate::shutdown::{cancel_on_signal, Lifetime};
use crate::store::{Store, StoreError};

/// A process's typed configuration.
pub trait ServiceConfig: Sized {
    fn load(src: &Source) -> Result<Self, ConfigError>;
    fn common(&self) -> &CommonConfig;
    /// Where the process serves HTTP: its API, or its health and metrics.
    fn http_addr(&self) -> SocketAddr;
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
    let common = config.common();
    if let Err(e) = crate::tls::startup_check(&common.amqp_urls, &common.redis_url, &common.tls).await {
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

/// What a long-running process runs on, opened once from its typed configuration: its metrics,
/// its Redis, its HTTP listener and its broker link, whose supervisor is the first of its
/// `background` tasks. The process's `run` takes it apart.
pub struct Process {
    pub metrics: Metrics,
    pub store: Store,
    pub listener: TcpListener,
    pub broker: BrokerLink,
    pub lifetime: Lifetime,
    pub background: Background,
}

/// Why a process could not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Process {
    /// Opens the process `name` (its metrics' name too) under `lifetime`.
    pub async fn open<C: ServiceConfig>(
        name: &'static str,
        config: &C,
        lifetime: &Lifetime,
    ) -> Result<Self, OpenError> {
        let common = config.common();
        let metrics = Metrics::new(name);
        let store = open_store(common, metrics.clone())?;
        let addr = config.http_addr();
        let listener = crate::ops::bind(addr).await.map_err(|source| OpenError::Bind { addr, source })?;
        let mut background = Background { cancel: lifetime.child(), tasks: Vec::new() };
        let (broker, supervisor) = supervise_broker(common, metrics.clone(), background.token());
        background.spawn(supervisor);
        Ok(Process { metrics, store, listener, broker, lifetime: lifetime.clone(), background })
    }
}

/// The tasks a process's work needs while it drains (the broker supervisor, the HTTP surface,
/// reporters), each holding `token`, a child of the process's [`Lifetime`]. The process stops them
/// once its work has drained, and every one of them is awaited.
pub struct Background {
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Background {
    /// The token a background task ends on.
    pub fn token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Runs `task` until it ends, its result dropped; `stop` awaits it.
    pub fn spawn<T: Send + 'static>(&mut self, task: impl Future<Output = T> + Send + 'static) {
        self.tasks.push(tokio::spawn(async move {
            let _ = task.await;
        }));
    }

    /// Cancels the background token and waits for every task.
    pub async fn stop(self) {
        self.cancel.cancel();
        for task in self.tasks {
            let _ = task.await;
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
