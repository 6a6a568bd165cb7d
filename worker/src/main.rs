//! `worker`: loads configuration, then consumes jobs until SIGTERM, draining within the grace period.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    fleet_platform::service::main("worker", fleet_worker::run).await
}
