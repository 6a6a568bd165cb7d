//! Graceful shutdown: one root token per process, and the children it hands out.
//!
//! The root ends the process; `intake`, its child, is what a signal cancels: stop taking work.
//! Tasks the work still needs while it drains (the broker supervisor, the HTTP surface, a worker
//! channel's ack sender) hold other children of the root, which their owner cancels once the work
//! has drained, or the runner with the root at the very end. Cancelling the root cancels every
//! child; every token a process makes is one of this tree's (`intake`, `child`, or a child of
//! those).

use tokio_util::sync::CancellationToken;

/// A process's shutdown tree.
#[derive(Clone, Debug)]
pub struct Lifetime {
    root: CancellationToken,
    intake: CancellationToken,
}

impl Default for Lifetime {
    fn default() -> Self {
        Self::new()
    }
}

impl Lifetime {
    pub fn new() -> Self {
        let root = CancellationToken::new();
        let intake = root.child_token();
        Self { root, intake }
    }

    /// Cancelled when the process should stop taking work (a signal, or the end).
    pub fn intake(&self) -> CancellationToken {
        self.intake.clone()
    }

    /// A token for a task that must outlive the intake: its owner cancels it once the work that
    /// needs it has drained; the end of the process cancels it in any case.
    pub fn child(&self) -> CancellationToken {
        self.root.child_token()
    }

    /// Ends the process: every token of the tree is cancelled.
    pub fn end(&self) {
        self.root.cancel();
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_intake_ends_alone_and_the_end_ends_everything() {
        let life = Lifetime::new();
        let background = life.child();
        life.intake().cancel();
        assert!(life.intake().is_cancelled());
        assert!(!background.is_cancelled(), "the broker outlives the intake");
        life.end();
        assert!(background.is_cancelled() && life.child().is_cancelled());
    }
}
