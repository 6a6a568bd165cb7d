//! The worker's job tasks, across its channels: at most its concurrency at once, collected
//! as they end rather than awaited one by one, and at shutdown let finish within the grace period.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

/// The running jobs and the permits that bound them: one permit of the worker's concurrency per
/// running job, whatever its kind and whichever channel delivered it, taken before the job
/// task is spawned and released once its delivery is settled.
pub(super) struct JobTasks {
    pub(super) permits: Arc<Semaphore>,
    /// The permit the next delivery runs under, taken before it is received.
    pub(super) permit: Option<OwnedSemaphorePermit>,
    tasks: JoinSet<()>,
    pub(super) flight: Arc<Flight>,
}

impl JobTasks {
    pub(super) fn new(concurrency: u16) -> Self {
        JobTasks {
            permits: Arc::new(Semaphore::new(usize::from(concurrency))),
            permit: None,
            // Finished jobs are collected as new ones start and when the last one in flight ends
            // (`flight`), not awaited one by one: that woke the intake once more for every job.
            tasks: JoinSet::new(),
            flight: Arc::new(Flight::default()),
        }
    }

    /// Runs `job` under the permit taken for it; `hold` (its channel's) is kept until it ends.
    pub(super) fn spawn<H: Send + 'static>(
        &mut self,
        job: impl std::future::Future<Output = ()> + Send + 'static,
        hold: H,
    ) {
        let held = (self.permit.take(), hold, self.flight.enter());
        self.tasks.spawn(async move {
            job.await;
            drop(held);
        });
        self.reap();
    }

    /// Collects the job tasks that have finished, without waiting for any; reports a panic.
    pub(super) fn reap(&mut self) {
        while let Some(done) = self.tasks.try_join_next() {
            if let Err(e) = done {
                if e.is_panic() {
                    tracing::error!("a job task panicked; its delivery returns to the queue");
                }
            }
        }
    }

    /// Whether no job is in flight: the last job's task may still be ending, but its count says
    /// its work is done.
    pub(super) fn idle(&self) -> bool {
        self.flight.jobs.load(Ordering::Acquire) == 0
    }

    /// Lets held jobs finish within `grace`; the rest are aborted and their deliveries, never
    /// acked, return to the queue when their channel closes.
    pub(super) async fn drain(&mut self, grace: Duration) {
        let tasks = &mut self.tasks;
        if tasks.is_empty() {
            return;
        }
        tracing::info!(held = tasks.len(), grace_s = grace.as_secs_f64(), "finishing held jobs");
        let finished = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        if finished.is_err() {
            tracing::warn!(unfinished = tasks.len(), "grace period over; returning unfinished jobs to the queue");
            tasks.shutdown().await;
        }
    }
}

/// The worker's jobs in flight, across its channels.
#[derive(Default)]
pub(super) struct Flight {
    jobs: AtomicUsize,
    /// Woken when the last job in flight ends.
    pub(super) idle: Notify,
}

/// One job in flight, until its task drops it: when it ends, panics or is aborted.
struct InFlight(Arc<Flight>);

impl Flight {
    fn enter(self: &Arc<Self>) -> InFlight {
        self.jobs.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.jobs.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_last_job_in_flight_wakes_the_loop_even_when_its_task_panics() {
        let flight = Arc::new(Flight::default());
        let (first, last) = (flight.enter(), flight.enter());
        drop(first);
        assert_eq!(flight.jobs.load(Ordering::Acquire), 1);
        let task = tokio::spawn(async move {
            let _held = last;
            panic!("a job panics");
        });
        assert!(task.await.unwrap_err().is_panic());
        assert_eq!(flight.jobs.load(Ordering::Acquire), 0);
        tokio::time::timeout(Duration::from_secs(5), flight.idle.notified()).await.expect("the loop is woken");
    }
}
