//! `dispatcher`: loads configuration, then serves the fleet's HTTP API until SIGTERM;
//! `dispatcher --print-openapi` prints the API's OpenAPI document instead.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    // The API's contract, as `docs/openapi.json` holds it (no configuration needed).
    if std::env::args().nth(1).as_deref() == Some("--print-openapi") {
        print!("{}", fleet_dispatcher::openapi_text());
        return ExitCode::SUCCESS;
    }
    fleet_platform::service::main("dispatcher", fleet_dispatcher::run).await
}
