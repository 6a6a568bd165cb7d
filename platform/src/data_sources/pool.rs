//! A bounded pool of one source's connections: at most `max_connections` leased at once (which
//! bounds the source's concurrent queries too), idle ones kept for reuse a while. A connection
//! goes back only when its lease is released after a clean end; anything else drops it.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use super::error::DataSourceError;

/// How long an idle connection is kept: past it, the server or a middlebox may have dropped it.
const IDLE_LIFETIME: Duration = Duration::from_secs(300);

pub(crate) struct Pool<C> {
    slots: Semaphore,
    max_connections: u32,
    idle: Mutex<Vec<(C, Instant)>>,
}

/// One of the pool's slots, held for one operation: the connection it reused, or none yet.
pub(crate) struct Lease<'p, C> {
    pool: &'p Pool<C>,
    conn: Option<C>,
    reused: bool,
    /// How long the reused connection sat idle.
    idle_for: Duration,
    _slot: SemaphorePermit<'p>,
}

impl<C> Pool<C> {
    pub(crate) fn new(max_connections: u32) -> Self {
        Pool { slots: Semaphore::new(max_connections as usize), max_connections, idle: Mutex::new(Vec::new()) }
    }

    /// A slot within `wait` (`Busy` past it), with the most recently used idle connection, if any
    /// is fresh enough.
    pub(crate) async fn lease(&self, wait: Duration) -> Result<Lease<'_, C>, DataSourceError> {
        let busy = || DataSourceError::Busy { max_connections: self.max_connections };
        let slot = match tokio::time::timeout(wait, self.slots.acquire()).await {
            Ok(Ok(slot)) => slot,
            Ok(Err(_)) | Err(_) => return Err(busy()),
        };
        let conn = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.retain(|(_, since)| since.elapsed() < IDLE_LIFETIME);
            idle.pop()
        };
        let idle_for = conn.as_ref().map_or(Duration::ZERO, |(_, since)| since.elapsed());
        let conn = conn.map(|(conn, _)| conn);
        Ok(Lease { pool: self, reused: conn.is_some(), conn, idle_for, _slot: slot })
    }
}

impl<C> Lease<'_, C> {
    /// The connection, when the lease has one.
    pub(crate) fn conn(&mut self) -> Option<&mut C> {
        self.conn.as_mut()
    }

    /// Whether the connection was reused from the pool (it may have died while idle).
    pub(crate) fn reused(&self) -> bool {
        self.reused && self.conn.is_some()
    }

    /// How long the reused connection sat idle (zero for none).
    pub(crate) fn idle_for(&self) -> Duration {
        self.idle_for
    }

    /// Puts a new connection in the lease.
    pub(crate) fn fill(&mut self, conn: C) -> &mut C {
        self.reused = false;
        self.conn.insert(conn)
    }

    /// Takes the connection out: it will not go back to the pool.
    pub(crate) fn take(&mut self) -> Option<C> {
        self.conn.take()
    }

    /// Ends the lease, keeping its connection for the next one.
    pub(crate) fn release(mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.idle.lock().unwrap_or_else(|p| p.into_inner()).push((conn, Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn leases_are_bounded_and_released_connections_reused() {
        let pool: Pool<u32> = Pool::new(2);
        let mut first = pool.lease(Duration::from_millis(10)).await.unwrap();
        assert!(first.conn().is_none() && !first.reused());
        first.fill(7);
        let second = pool.lease(Duration::from_millis(10)).await.unwrap();
        let third = pool.lease(Duration::from_millis(10)).await;
        assert_eq!(third.err(), Some(DataSourceError::Busy { max_connections: 2 }));
        first.release();
        drop(second);
        let mut again = pool.lease(Duration::from_millis(10)).await.unwrap();
        assert!(again.reused());
        assert_eq!(again.take(), Some(7));
        drop(again);
        let empty = pool.lease(Duration::from_millis(10)).await.unwrap();
        assert!(!empty.reused(), "a connection taken out never comes back");
    }
}
