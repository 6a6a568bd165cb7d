//! Which new jobs take a light lane (`Topology::light_queue`): new turns and tool calls of tenants
//! that are not flooding the fleet, as this dispatcher counts them (a `fair::LaneBucket` per kind
//! and tenant), so a tenant's single job never waits behind another tenant's thousands in the
//! work queue. Each dispatcher counts on its own: with several, a tenant may send a little more
//! through it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use fleet_protocol::envelope::JobKind;
use fleet_protocol::fair::{LaneBucket, Priority};

/// Tenants remembered per kind before idle ones (whose buckets have refilled) are forgotten.
const REMEMBERED: usize = 10_000;

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
}

impl LightLanes {
    pub fn new(turns: LaneRate, tool_calls: LaneRate) -> Self {
        LightLanes { started: Instant::now(), turns: Lane::new(turns), tool_calls: Lane::new(tool_calls) }
    }

    /// Whether `tenant`'s new job of `kind` goes to the light lane (taking one of its tokens).
    pub fn take(&self, kind: JobKind, tenant: &str, priority: Priority) -> bool {
        let now = self.started.elapsed().as_secs_f64();
        match kind {
            JobKind::Turn => self.turns.take(now, tenant, priority),
            JobKind::ToolCall => self.tool_calls.take(now, tenant, priority),
            JobKind::Webhook => false,
        }
    }
}
