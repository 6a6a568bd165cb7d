//! Which new turns take the light lane (`Topology::light_turns_queue`): those of tenants that are
//! not flooding the fleet, as this dispatcher counts them (a `fair::LaneBucket` per tenant), so a
//! tenant's single turn never waits behind another tenant's thousands in the turns' work queue.
//! Each dispatcher counts on its own: with several, a tenant may send a little more through it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use fleet_protocol::fair::LaneBucket;

/// Tenants remembered before idle ones (whose buckets have refilled) are forgotten.
const REMEMBERED: usize = 10_000;

pub struct LightLanes {
    /// New turns a second a tenant may send to the light lane; 0 turns the lane off.
    rate: f64,
    burst: f64,
    started: Instant,
    tenants: Mutex<HashMap<String, LaneBucket>>,
}

impl LightLanes {
    pub fn new(rate: f64, burst: u32) -> Self {
        LightLanes { rate, burst: f64::from(burst), started: Instant::now(), tenants: Mutex::new(HashMap::new()) }
    }

    /// Whether `tenant`'s new turn goes to the light lane (taking one of its tokens).
    pub fn take(&self, tenant: &str) -> bool {
        if self.rate <= 0.0 {
            return false;
        }
        let now = self.started.elapsed().as_secs_f64();
        let mut tenants = self.tenants.lock().expect("lanes lock");
        if tenants.len() >= REMEMBERED && !tenants.contains_key(tenant) {
            tenants.retain(|_, b| !b.is_full(now, self.rate, self.burst));
        }
        let bucket = tenants.entry(tenant.to_string()).or_insert_with(|| LaneBucket::new(self.burst, now));
        bucket.take(now, self.rate, self.burst)
    }
}
