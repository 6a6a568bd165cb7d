//! How this dispatcher treats a tenant flooding the fleet, as it counts them (a `fair::LaneBucket`
//! per kind and tenant). Only new jobs of tenants within their allowance take a light lane
//! (`Topology::light_queue`), so a tenant's single job never waits behind another tenant's
//! thousands in the work queue. And while other tenants use the dispatcher too, only a few of a
//! flooding tenant's submissions are taken in at once (`admit`): its many clients do not hold the
//! Redis connection, the publisher and the CPU another tenant's request needs, and its flood
//! reaches the workers at a pace they take it in beside other work. A dispatcher serving one
//! tenant never holds it back. Each dispatcher counts on its own: with several, a tenant may send
//! a little more through it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use fleet_protocol::envelope::JobKind;
use fleet_protocol::fair::{LaneBucket, Priority};

/// Tenants remembered per kind before idle ones (whose buckets have refilled) are forgotten.
const REMEMBERED: usize = 10_000;

/// How recently another tenant must have submitted for a flooding tenant's submissions to be
/// limited (seconds): a tenant alone on the dispatcher takes what it can.
const SHARED_WINDOW_S: f64 = 60.0;

/// One kind's lane allowance: new jobs a second a tenant may send to it (0 turns it off) and how
/// many at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LaneRate {
    pub rate: f64,
    pub burst: u32,
}

struct Lane {
    rate: f64,
    burst: f64,
    tenants: Mutex<HashMap<String, LaneBucket>>,
}

pub struct LightLanes {
    started: Instant,
    turns: Lane,
    tool_calls: Lane,
    /// Submissions of one flooding tenant taken in at once (0: no limit).
    flooding_submissions: usize,
    /// Each flooding tenant's submissions being taken in.
    admitting: Mutex<HashMap<String, Arc<Semaphore>>>,
    last: Mutex<LastTenants>,
}

/// The two tenants that submitted last, and when: whether a tenant shares the dispatcher.
#[derive(Default)]
struct LastTenants {
    latest: Option<(String, f64)>,
    /// Always another tenant than `latest`'s.
    before: Option<(String, f64)>,
}

impl LastTenants {
    /// Notes `tenant`'s submission at `now_s`; returns when another tenant last submitted.
    fn note(&mut self, tenant: &str, now_s: f64) -> Option<f64> {
        match &mut self.latest {
            Some((latest, at)) if latest == tenant => *at = now_s,
            _ => {
                self.before = self.latest.take();
                self.latest = Some((tenant.to_string(), now_s));
            }
        }
        self.before.as_ref().map(|(_, at)| *at)
    }
}

/// A submission's place among its tenant's being taken in; dropping it lets the next one in.
#[must_use]
pub struct Admitted {
    place: Option<OwnedSemaphorePermit>,
    waited: bool,
}

impl Admitted {
    /// Whether the submission holds one of its flooding tenant's limited places.
    pub fn is_limited(&self) -> bool {
        self.place.is_some()
    }

    /// Whether it waited for that place.
    pub fn waited(&self) -> bool {
        self.waited
    }
}

impl Lane {
    fn new(rate: LaneRate) -> Self {
        Lane { rate: rate.rate, burst: f64::from(rate.burst), tenants: Mutex::new(HashMap::new()) }
    }

    fn take(&self, now: f64, tenant: &str, priority: Priority) -> bool {
        if self.rate <= 0.0 {
            return false;
        }
        let mut tenants = self.tenants.lock().expect("lanes lock");
        if tenants.len() >= REMEMBERED && !tenants.contains_key(tenant) {
            tenants.retain(|_, b| !b.is_full(now, self.rate, self.burst));
        }
        let bucket = tenants.entry(tenant.to_string()).or_insert_with(|| LaneBucket::new(self.burst, now));
        bucket.take(now, self.rate, self.burst, priority)
    }

    fn flooding(&self, now: f64, tenant: &str) -> bool {
        if self.rate <= 0.0 {
            return false;
        }
        let tenants = self.tenants.lock().expect("lanes lock");
        tenants.get(tenant).is_some_and(|b| !b.has_token(now, self.rate, self.burst))
    }
}

impl LightLanes {
    /// `flooding_submissions`: how many of a flooding tenant's submissions are taken in at once
    /// (0: as many as arrive).
    pub fn new(turns: LaneRate, tool_calls: LaneRate, flooding_submissions: usize) -> Self {
        LightLanes {
            started: Instant::now(),
            turns: Lane::new(turns),
            tool_calls: Lane::new(tool_calls),
            flooding_submissions,
            admitting: Mutex::new(HashMap::new()),
            last: Mutex::new(LastTenants::default()),
        }
    }

    /// Waits, if `tenant` is flooding with jobs of `kind` while another tenant submitted in the
    /// last minute, until fewer than `flooding_submissions` of its submissions are being taken in
    /// (first come, first in); at once otherwise. The waiting costs nothing but the request's
    /// memory: it comes before the job's key, record and publish (`submit_job`).
    pub async fn admit(&self, kind: JobKind, tenant: &str) -> Admitted {
        let free = Admitted { place: None, waited: false };
        if self.flooding_submissions == 0 {
            return free;
        }
        let now = self.started.elapsed().as_secs_f64();
        let other = self.last.lock().expect("last tenants lock").note(tenant, now);
        let shared = other.is_some_and(|at| now - at <= SHARED_WINDOW_S);
        if !(shared && self.lane(kind).is_some_and(|lane| lane.flooding(now, tenant))) {
            return free;
        }
        let gate = {
            let mut admitting = self.admitting.lock().expect("admission lock");
            if admitting.len() >= REMEMBERED && !admitting.contains_key(tenant) {
                // A gate nobody holds or waits on is only memory.
                admitting.retain(|_, gate| Arc::strong_count(gate) > 1);
            }
            let gate = admitting.entry(tenant.to_string());
            gate.or_insert_with(|| Arc::new(Semaphore::new(self.flooding_submissions))).clone()
        };
        match gate.clone().try_acquire_owned() {
            Ok(place) => Admitted { place: Some(place), waited: false },
            Err(_) => Admitted { place: gate.acquire_owned().await.ok(), waited: true },
        }
    }

    /// Whether `tenant`'s new job of `kind` goes to the light lane (taking one of its tokens).
    pub fn take(&self, kind: JobKind, tenant: &str, priority: Priority) -> bool {
        let now = self.started.elapsed().as_secs_f64();
        self.lane(kind).is_some_and(|lane| lane.take(now, tenant, priority))
    }

    /// `kind`'s lane; webhooks have none (they belong to no tenant).
    fn lane(&self, kind: JobKind) -> Option<&Lane> {
        match kind {
            JobKind::Turn => Some(&self.turns),
            JobKind::ToolCall => Some(&self.tool_calls),
            JobKind::Webhook => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TURNS: LaneRate = LaneRate { rate: 0.001, burst: 2 };
    const CALLS: LaneRate = LaneRate { rate: 0.001, burst: 200 };

    /// Whether an admission of `tenant`'s turn is held up (by the places already taken).
    async fn waits(lanes: &LightLanes, tenant: &str) -> bool {
        let admit = lanes.admit(JobKind::Turn, tenant);
        tokio::time::timeout(std::time::Duration::from_millis(50), admit).await.is_err()
    }

    #[tokio::test]
    async fn only_a_flooding_tenants_submissions_wait_and_only_beyond_the_limit() {
        let lanes = LightLanes::new(TURNS, CALLS, 2);
        let _ = lanes.admit(JobKind::ToolCall, "b").await;
        let first: Vec<Admitted> = futures::future::join_all((0..5).map(|_| lanes.admit(JobKind::Turn, "a"))).await;
        assert_eq!(first.len(), 5, "a tenant within its allowance is never held");
        while lanes.take(JobKind::Turn, "a", Priority::Normal) {}
        let held = [lanes.admit(JobKind::Turn, "a").await, lanes.admit(JobKind::Turn, "a").await];
        assert!(held.iter().all(|a| a.is_limited() && !a.waited()), "two places of the flooding tenant");
        assert!(waits(&lanes, "a").await, "a third of the flooding tenant's waits");
        assert!(!waits(&lanes, "b").await, "another tenant does not");
        assert!(!lanes.admit(JobKind::ToolCall, "a").await.is_limited(), "its tool calls are within their allowance");
        let mut next = Box::pin(lanes.admit(JobKind::Turn, "a"));
        assert!(futures::poll!(&mut next).is_pending(), "the next one waits");
        drop(held);
        assert!(next.await.waited(), "a place freed lets the next one in");
    }

    #[tokio::test]
    async fn a_tenant_alone_on_the_dispatcher_is_not_held_back() {
        let lanes = LightLanes::new(TURNS, CALLS, 1);
        while lanes.take(JobKind::Turn, "a", Priority::Normal) {}
        let _held = lanes.admit(JobKind::Turn, "a").await;
        assert!(!waits(&lanes, "a").await, "nobody else submitted");
    }

    #[test]
    fn the_last_tenants_say_when_another_one_last_submitted() {
        let mut last = LastTenants::default();
        assert_eq!(last.note("a", 1.0), None);
        assert_eq!(last.note("a", 2.0), None, "still alone");
        assert_eq!(last.note("b", 3.0), Some(2.0));
        assert_eq!(last.note("b", 4.0), Some(2.0));
        assert_eq!(last.note("a", 5.0), Some(4.0));
        assert_eq!(last.note("c", 6.0), Some(5.0));
    }

    #[tokio::test]
    async fn no_limit_when_it_is_zero_or_the_lane_is_off() {
        let unlimited = LightLanes::new(TURNS, CALLS, 0);
        let _ = unlimited.admit(JobKind::Turn, "b").await;
        while unlimited.take(JobKind::Turn, "a", Priority::Normal) {}
        assert!(!unlimited.admit(JobKind::Turn, "a").await.is_limited());
        let off = LightLanes::new(LaneRate { rate: 0.0, burst: 2 }, CALLS, 1);
        let _ = off.admit(JobKind::Turn, "b").await;
        off.take(JobKind::Turn, "a", Priority::Normal);
        let _held = off.admit(JobKind::Turn, "a").await;
        assert!(!waits(&off, "a").await, "a lane that is off counts no tenant as flooding");
    }
}
