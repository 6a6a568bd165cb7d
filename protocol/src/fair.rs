//! Fair sharing of a provider's budget across tenants: the priority a turn may carry, the
//! per-tenant settings (`FLEET_TENANT_WEIGHTS`, `FLEET_TENANT_MAX_CONCURRENT_TURNS`), and the
//! decisions the budget's Redis script makes (`platform::store::budget`), as plain functions.
//!
//! Steps waiting for a provider take places in one line ordered by start-time fair queueing:
//! a tenant's next place is at its own finish tag or the line's virtual time, whichever is later,
//! and each place moves the tenant's tag on by the call's cost over the tenant's weight. So a
//! tenant with a thousand waiting steps holds places far down the line, and a tenant arriving
//! now is placed at its front. Within a tenant, its places go to its steps by priority, then by
//! arrival. A step runs when the budget has room now for every place ahead of its own and its
//! own. A tenant that has been using more than half the burst on its own (`heavy`) may only fill
//! the budget's burst up to `1 - reserve` of it, so a tenant that arrives finds room at once: it
//! runs from that reserve, and needs room only for its own places ahead (`places_ahead`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::tenant::is_tenant_name;

/// The share of a budget's burst kept for tenants that are not heavy users (a tenant arriving
/// behind another's backlog runs from it at once).
pub const LIGHT_RESERVE: f64 = 0.5;

/// A turn's priority within its tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    High,
    #[default]
    Normal,
    Low,
}

impl Priority {
    /// Its class in the tenant's line: lower goes first.
    pub fn class(self) -> u8 {
        match self {
            Priority::High => 0,
            Priority::Normal => 1,
            Priority::Low => 2,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
}

/// The tenant a budget counts a step under when its turn has none (stored before tenants): not a
/// valid tenant name, so it never meets a real one.
pub const NO_TENANT: &str = "~";

/// The entry of a per-tenant setting that applies to every tenant not named (`*=N`).
pub const EVERY_OTHER_TENANT: &str = "*";

/// `TENANT=N` entries, comma-separated, each N at least `min` (`FLEET_TENANT_WEIGHTS`,
/// `FLEET_TENANT_MAX_CONCURRENT_TURNS`); `*=N` sets it for every tenant not named.
pub fn parse_per_tenant(raw: &str, min: u32) -> Result<BTreeMap<String, u32>, String> {
    let mut out = BTreeMap::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (tenant, n) = entry.split_once('=').ok_or_else(|| format!("{entry:?} is not TENANT=NUMBER"))?;
        let tenant = tenant.trim();
        if tenant != EVERY_OTHER_TENANT && !is_tenant_name(tenant) {
            return Err(format!("{tenant:?} is not a tenant name (1-64 of A-Z a-z 0-9 . _ -)"));
        }
        let n: u32 = n.trim().parse().map_err(|_| format!("{tenant}'s {:?} is not a whole number", n.trim()))?;
        if n < min {
            return Err(format!("{tenant}'s {n} is below {min}"));
        }
        out.insert(tenant.to_string(), n);
    }
    Ok(out)
}

/// A per-tenant setting's value for `tenant`: its own entry, else the `*` entry; and whether it
/// was named (a metric labels only named tenants, so the label's values stay bounded).
pub fn setting_for(settings: &BTreeMap<String, u32>, tenant: &str) -> Option<(u32, bool)> {
    match settings.get(tenant) {
        Some(n) => Some((*n, true)),
        None => settings.get(EVERY_OTHER_TENANT).map(|n| (*n, false)),
    }
}

/// Whether a tenant whose own use runs `level_ms` ahead of now is a heavy user of a bucket with
/// `tolerance_ms` of burst.
pub fn heavy(level_ms: f64, tolerance_ms: f64) -> bool {
    level_ms >= tolerance_ms * (1.0 - LIGHT_RESERVE)
}

/// The burst a tenant may fill: all of it, or for a heavy user all but the light tenants' reserve.
pub fn tolerance_for(heavy: bool, tolerance_ms: f64) -> f64 {
    if heavy {
        tolerance_ms * (1.0 - LIGHT_RESERVE)
    } else {
        tolerance_ms
    }
}

/// One bucket as a waiting step sees it: how much of its time is free now (`room_ms`, the burst
/// the tenant may fill less what is committed, possibly negative) and what one call needs of it
/// (its cost, at most the whole burst, so a call bigger than the burst still runs once it is free).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Room {
    pub room_ms: f64,
    pub need_ms: f64,
}

impl Room {
    pub fn new(now: f64, early: f64, tat: f64, tolerance: f64, cost_ms: f64) -> Self {
        Room { room_ms: now + early + tolerance - tat.max(now), need_ms: cost_ms.min(tolerance).max(f64::MIN_POSITIVE) }
    }
}

/// What a step with `ahead` places before its own gets: to run now (the buckets have room for
/// those ahead and itself), or how long until they might (every bucket's room grows by a
/// millisecond a millisecond).
pub fn admit(rooms: &[Room], ahead: u64) -> Result<(), f64> {
    let calls = (ahead + 1) as f64;
    let short = rooms.iter().map(|r| calls * r.need_ms - r.room_ms).fold(0.0, f64::max);
    if short <= 0.0 {
        Ok(())
    } else {
        Err(short.ceil().max(1.0))
    }
}

/// The places a step must leave room for before its own: a heavy user's, every place ahead of its
/// own in the line (its tenant's and others'); any other tenant's, only its own tenant's, since it
/// runs from the light tenants' reserve, which the heavy users' places cannot use anyway.
pub fn places_ahead(heavy: bool, in_line: u64, own: u64) -> u64 {
    if heavy {
        in_line
    } else {
        own
    }
}

/// Start-time fair queueing's tags: a new place starts at the later of the line's virtual time and
/// the tenant's finish tag; the tenant's tag moves on by the cost over its weight.
pub fn place(virtual_time: f64, finish: Option<f64>, cost_ms: f64, weight: u32) -> (f64, f64) {
    let start = finish.unwrap_or(virtual_time).max(virtual_time);
    (start, start + cost_ms / f64::from(weight.max(1)))
}

/// A tenant's allowance of a light lane (`Topology::light_queue`), as one dispatcher counts it: a
/// token bucket of `burst` new jobs refilled at `rate` a second. A tenant within it is not flooding
/// the fleet, and its new job skips the work queue's backlog. Priority decides, within the tenant,
/// which jobs keep the lane as the bucket runs low: a `low` job takes a token only while the
/// bucket is more than half full, a `normal` one while a token is left, and a `high` one may
/// borrow up to half a burst more (which later `normal` jobs wait for).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LaneBucket {
    tokens: f64,
    at_s: f64,
}

/// The tokens a job of `priority` must leave in a bucket of `burst` (negative: it may borrow).
pub fn lane_floor(priority: Priority, burst: f64) -> f64 {
    match priority {
        Priority::High => -burst / 2.0,
        Priority::Normal => 0.0,
        Priority::Low => burst / 2.0,
    }
}

impl LaneBucket {
    pub fn new(burst: f64, now_s: f64) -> Self {
        LaneBucket { tokens: burst, at_s: now_s }
    }

    /// The tokens at `now_s`: those left, plus what `rate` refilled since, up to `burst`.
    fn level(&self, now_s: f64, rate: f64, burst: f64) -> f64 {
        (self.tokens + (now_s - self.at_s).max(0.0) * rate).min(burst)
    }

    /// Whether a job of `priority` may take a token from `tokens`.
    fn may_take(tokens: f64, burst: f64, priority: Priority) -> bool {
        tokens - 1.0 >= lane_floor(priority, burst)
    }

    /// Takes one job's token if its priority may: whether the job goes to the light lane.
    pub fn take(&mut self, now_s: f64, rate: f64, burst: f64, priority: Priority) -> bool {
        self.tokens = self.level(now_s, rate, burst);
        self.at_s = now_s;
        let light = Self::may_take(self.tokens, burst, priority);
        if light {
            self.tokens -= 1.0;
        }
        light
    }

    /// Whether a `normal` job would find a token at `now_s` (taking none): a tenant whose bucket
    /// has none is flooding the fleet.
    pub fn has_token(&self, now_s: f64, rate: f64, burst: f64) -> bool {
        Self::may_take(self.level(now_s, rate, burst), burst, Priority::Normal)
    }

    /// Whether the bucket has refilled by `now_s` (its tenant is idle: it may be forgotten).
    pub fn is_full(&self, now_s: f64, rate: f64, burst: f64) -> bool {
        self.level(now_s, rate, burst) >= burst
    }
}

/// A waiter's order within its tenant: by priority, then by arrival.
pub fn waiter_score(priority: Priority, seq: u64) -> f64 {
    f64::from(priority.class()) * 2f64.powi(40) + seq as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line simulated with the same decisions the script makes: returns the tenants in the order
    /// their places are served.
    fn served_order(arrivals: &[(&str, u32)]) -> Vec<String> {
        let (v, mut finish, mut line) = (0.0, BTreeMap::<String, f64>::new(), Vec::new());
        for (tenant, weight) in arrivals {
            let (start, end) = place(v, finish.get(*tenant).copied(), 100.0, *weight);
            finish.insert(tenant.to_string(), end);
            line.push((start, line.len(), tenant.to_string()));
        }
        line.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        line.into_iter().map(|(_, _, t)| t).collect()
    }

    #[test]
    fn a_tenant_arriving_behind_a_backlog_is_served_between_its_places() {
        let mut arrivals = vec![("a", 1); 6];
        arrivals.extend([("b", 1); 2]);
        let order = served_order(&arrivals);
        assert_eq!(order[..4], ["a", "b", "a", "b"], "{order:?}");
    }

    #[test]
    fn weights_share_the_line_in_proportion() {
        let mut arrivals = vec![("a", 2); 8];
        arrivals.extend([("b", 1); 8]);
        let first_six = served_order(&arrivals)[..6].to_vec();
        assert_eq!(first_six.iter().filter(|t| *t == "a").count(), 4, "{first_six:?}");
    }

    #[test]
    fn an_idle_tenant_earns_no_credit_for_later() {
        let (start, _) = place(5000.0, Some(100.0), 100.0, 1);
        assert_eq!(start, 5000.0);
    }

    #[test]
    fn a_step_runs_when_there_is_room_for_everyone_ahead_and_itself() {
        let room = Room::new(1000.0, 0.0, 1000.0, 1000.0, 100.0);
        assert_eq!(room.room_ms, 1000.0);
        assert_eq!(admit(&[room], 9), Ok(()));
        assert_eq!(admit(&[room], 10), Err(100.0));
        let full = Room::new(1000.0, 0.0, 2000.0, 1000.0, 100.0);
        assert_eq!(admit(&[full], 0), Err(100.0), "one interval until the first frees");
    }

    #[test]
    fn a_call_bigger_than_the_burst_runs_once_the_bucket_is_empty() {
        let empty = Room::new(0.0, 0.0, 0.0, 1000.0, 5000.0);
        assert_eq!(admit(&[empty], 0), Ok(()));
        let busy = Room::new(0.0, 0.0, 10.0, 1000.0, 5000.0);
        assert_eq!(admit(&[busy], 0), Err(10.0));
    }

    #[test]
    fn the_tightest_bucket_decides() {
        let requests = Room::new(0.0, 0.0, 0.0, 1000.0, 100.0);
        let tokens = Room::new(0.0, 0.0, 900.0, 1000.0, 200.0);
        assert_eq!(admit(&[requests, tokens], 0), Err(100.0));
    }

    #[test]
    fn a_heavy_user_leaves_the_reserve_to_others() {
        assert!(!heavy(499.0, 1000.0));
        assert!(heavy(500.0, 1000.0));
        assert_eq!(tolerance_for(true, 1000.0), 500.0);
        assert_eq!(tolerance_for(false, 1000.0), 1000.0);
    }

    #[test]
    fn priorities_order_a_tenants_waiters_before_arrival_does() {
        assert!(waiter_score(Priority::High, 99) < waiter_score(Priority::Normal, 1));
        assert!(waiter_score(Priority::Normal, 99) < waiter_score(Priority::Low, 1));
        assert!(waiter_score(Priority::Normal, 1) < waiter_score(Priority::Normal, 2));
        let p: Priority = serde_json::from_str("\"high\"").unwrap();
        assert_eq!(p, Priority::High);
        assert!(serde_json::from_str::<Priority>("\"urgent\"").is_err());
    }

    #[test]
    fn per_tenant_settings_parse_and_name_their_problem() {
        let parsed = parse_per_tenant("acme=2, globex=1", 1).unwrap();
        assert_eq!(parsed.get("acme"), Some(&2));
        assert!(parse_per_tenant("acme=0", 1).unwrap_err().contains("below 1"));
        assert!(parse_per_tenant("a:b=1", 1).unwrap_err().contains("tenant name"));
        assert!(parse_per_tenant("acme", 1).unwrap_err().contains("TENANT=NUMBER"));
        assert!(parse_per_tenant("", 1).unwrap().is_empty());
    }

    #[test]
    fn a_tenant_within_its_lane_bucket_goes_light_and_a_flood_does_not() {
        let (rate, burst) = (2.0, 3.0);
        let mut bucket = LaneBucket::new(burst, 0.0);
        let normal = Priority::Normal;
        let burst_taken: Vec<bool> = (0..5).map(|_| bucket.take(0.0, rate, burst, normal)).collect();
        assert_eq!(burst_taken, [true, true, true, false, false]);
        assert!(bucket.take(0.5, rate, burst, normal), "refilled at two a second");
        assert!(!bucket.take(0.5, rate, burst, normal));
        assert!(!bucket.is_full(1.0, rate, burst));
        assert!(bucket.is_full(2.0, rate, burst), "idle long enough to be forgotten");
    }

    #[test]
    fn a_light_tenant_leaves_room_only_for_its_own_places_ahead() {
        // B's fourth place: three of B's and three of A's interleaved before it.
        assert_eq!(places_ahead(false, 6, 3), 3, "A's places cannot use the reserve B runs from");
        assert_eq!(places_ahead(true, 6, 3), 6, "a heavy user waits for every place ahead");
        let reserve = [Room { room_ms: 450.0, need_ms: 100.0 }];
        assert!(admit(&reserve, places_ahead(false, 6, 3)).is_ok());
        assert!(admit(&reserve, places_ahead(true, 6, 3)).is_err());
    }

    #[test]
    fn as_the_bucket_runs_low_a_tenants_low_jobs_leave_the_lane_first_and_high_ones_last() {
        let burst = 10.0;
        let mut bucket = LaneBucket::new(burst, 0.0);
        let taken =
            |bucket: &mut LaneBucket, p: Priority, n: usize| (0..n).filter(|_| bucket.take(0.0, 0.0, burst, p)).count();
        assert_eq!(taken(&mut bucket, Priority::Low, 20), 5, "low keeps half the burst");
        assert_eq!(taken(&mut bucket, Priority::Normal, 20), 5, "normal takes the rest");
        assert_eq!(taken(&mut bucket, Priority::High, 20), 5, "high borrows half a burst more");
        assert_eq!(taken(&mut bucket, Priority::Normal, 1), 0, "normal waits for the borrowed tokens");
    }

    #[test]
    fn a_tenant_floods_once_its_bucket_has_no_token_left_until_it_refills_one() {
        let (rate, burst) = (2.0, 3.0);
        let mut bucket = LaneBucket::new(burst, 0.0);
        assert!(bucket.has_token(0.0, rate, burst), "a new tenant is not flooding");
        while bucket.take(0.0, rate, burst, Priority::Normal) {}
        assert!(!bucket.has_token(0.0, rate, burst), "no token left");
        assert!(!bucket.has_token(0.4, rate, burst), "0.8 of a token refilled");
        assert!(bucket.has_token(0.5, rate, burst), "one token refilled");
        bucket.take(0.0, rate, burst, Priority::High);
        assert!(!bucket.has_token(0.5, rate, burst), "a borrowed token is paid back first");
    }

    #[test]
    fn a_star_entry_sets_every_other_tenant() {
        let caps = parse_per_tenant("acme=5, *=20", 1).unwrap();
        assert_eq!(setting_for(&caps, "acme"), Some((5, true)));
        assert_eq!(setting_for(&caps, "beta"), Some((20, false)));
        assert_eq!(setting_for(&parse_per_tenant("acme=5", 1).unwrap(), "beta"), None);
    }
}
