//! Graceful shutdown: one cancellation token, cancelled by SIGTERM or Ctrl-C, shared by every task.

use tokio_util::sync::CancellationToken;

/// Waits for SIGTERM or SIGINT, then cancels `token`. Returns when either the signal arrived or
/// `token` was cancelled by someone else.
pub async fn cancel_on_signal(token: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("interrupt received, shutting down"),
        _ = term => tracing::info!("SIGTERM received, shutting down"),
        _ = token.cancelled() => return,
    }
    token.cancel();
}
