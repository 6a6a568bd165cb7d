//! Honest health for a worker: readiness needs the broker, Redis and live consumers; liveness (the
//! watchdog) fails when the worker has had no consumer for longer than its grace while jobs wait,
//! so an orchestrator restarts a worker that runs but no longer works.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use fleet_platform::broker::BrokerLink;
use fleet_platform::ops::ReadinessCheck;
use fleet_platform::store::Store;
use fleet_protocol::envelope::JobKind;
use fleet_protocol::topology::Topology;

/// Whether the worker holds its consumers, and since when it has not.
pub struct Consumers {
    not_since: Mutex<Option<Instant>>,
}

impl Consumers {
    pub fn new() -> Arc<Self> {
        Arc::new(Consumers { not_since: Mutex::new(Some(Instant::now())) })
    }

    pub fn set(&self, consuming: bool) {
        let mut not_since = self.not_since.lock().unwrap();
        match (consuming, *not_since) {
            (true, _) => *not_since = None,
            (false, None) => *not_since = Some(Instant::now()),
            (false, Some(_)) => {}
        }
    }

    pub fn consuming(&self) -> bool {
        self.not_since.lock().unwrap().is_none()
    }

    /// How long the worker has been without consumers.
    pub fn idle_for(&self) -> Option<Duration> {
        self.not_since.lock().unwrap().map(|t| t.elapsed())
    }
}

/// Each check's future is boxed because `ReadinessCheck`, shared by every process's ops router,
/// returns a boxed future (a closure's future type cannot be named there).
pub fn readiness(link: BrokerLink, store: Store, consumers: Arc<Consumers>) -> ReadinessCheck {
    Arc::new(move || {
        let (link, store, consumers) = (link.clone(), store.clone(), consumers.clone());
        Box::pin(async move {
            if link.current().is_none() {
                return Err("broker not connected".to_string());
            }
            if !consumers.consuming() {
                return Err("not consuming".to_string());
            }
            store.redis().ping().await.map_err(|e| e.to_string())
        })
    })
}

/// Fails once the worker has had no consumer for more than `grace` while a work queue has
/// messages. A broker outage does not fail it: a restart would not help.
pub fn liveness(link: BrokerLink, topology: Topology, consumers: Arc<Consumers>, grace: Duration) -> ReadinessCheck {
    Arc::new(move || {
        let (link, topology, consumers) = (link.clone(), topology.clone(), consumers.clone());
        Box::pin(async move {
            let Some(idle) = consumers.idle_for().filter(|idle| *idle > grace) else { return Ok(()) };
            let Some(live) = link.current() else { return Ok(()) };
            let waiting = waiting_jobs(&live.connection, &topology).await;
            if waiting > 0 {
                return Err(format!("no consumer for {:.0}s while {waiting} job(s) wait", idle.as_secs_f64()));
            }
            Ok(())
        })
    })
}

async fn waiting_jobs(connection: &lapin::Connection, topology: &Topology) -> u64 {
    let Ok(channel) = connection.create_channel().await else { return 0 };
    let mut total = 0;
    for queue in JobKind::ALL.into_iter().flat_map(|kind| topology.waiting_queues(kind)) {
        let options = QueueDeclareOptions { passive: true, ..Default::default() };
        match channel.queue_declare(queue.as_str().into(), options, FieldTable::default()).await {
            Ok(q) => total += q.message_count() as u64,
            Err(_) => break,
        }
    }
    let _ = channel.close(200, "health".into()).await;
    total
}
