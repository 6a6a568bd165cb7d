//! The fleet's recent activity (`fleet_protocol::activity`): each worker's report (one script every
//! few seconds: how far its finished-job counters moved, what it runs now) and the console's read
//! (one pipeline). Every key shares the `{activity}` tag, so both work on Redis Cluster.

use crate::store::script::Lua;
use std::collections::{BTreeMap, HashMap};

use fleet_protocol::activity::{self, KindActivity};

use super::ConsoleIndex;
use crate::store::StoreError;

static REPORT: Lua = Lua::new(|| crate::store::script::load(&[REPORT_LUA]));

/// KEYS: the current bucket, the running hash, the workers' set. ARGV: worker, running (empty:
/// none), now ms, stale cutoff ms, bucket ttl s, retiring (1/0), then field, count pairs. Adds the
/// counts to the bucket, sets (or, retiring, drops) the worker's running report, and drops the
/// reports of workers gone quiet.
const REPORT_LUA: &str = include_str!("lua/report.lua");

/// One worker's report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActivityReport<'a> {
    pub worker_id: &'a str,
    /// `activity::encode_running`.
    pub running: String,
    /// Bucket fields and how far each moved.
    pub finished: BTreeMap<String, u64>,
    /// The worker is stopping: its running report goes.
    pub retiring: bool,
}

impl ConsoleIndex {
    /// Writes one worker's report at `now_ms` (one script).
    pub async fn report_activity(&self, report: &ActivityReport<'_>, now_ms: i64) -> Result<(), StoreError> {
        let mut inv = REPORT.prepare_invoke();
        inv.key(self.redis.keys.activity_bucket(activity::bucket_of(now_ms)))
            .key(self.redis.keys.activity_running())
            .key(self.redis.keys.activity_workers())
            .arg(report.worker_id)
            .arg(&report.running)
            .arg(now_ms)
            .arg(now_ms - activity::STALE_AFTER_MS)
            .arg(activity::BUCKET_TTL_SECS)
            .arg(if report.retiring { "1" } else { "0" });
        for (field, n) in &report.finished {
            inv.arg(field).arg(*n);
        }
        let r: Result<i64, _> = inv.invoke_async(&mut self.redis.conn().await?).await;
        self.redis.count(r).map(|_| ())
    }

    /// Each kind's activity at `now_ms`: the buckets of the last 15 minutes and the running reports
    /// of the workers heard from lately, read in one pipeline.
    pub async fn activity(&self, now_ms: i64) -> Result<BTreeMap<String, KindActivity>, StoreError> {
        let window = activity::window(now_ms);
        let mut pipe = redis::pipe();
        pipe.cmd("ZRANGEBYSCORE")
            .arg(self.redis.keys.activity_workers())
            .arg(now_ms - activity::STALE_AFTER_MS)
            .arg("+inf");
        pipe.cmd("HGETALL").arg(self.redis.keys.activity_running());
        for bucket in &window {
            pipe.cmd("HGETALL").arg(self.redis.keys.activity_bucket(*bucket));
        }
        let r: Result<Vec<redis::Value>, _> = pipe.query_async(&mut self.redis.conn().await?).await;
        let mut items = self.redis.count(r)?.into_iter();
        let corrupt = |e: &dyn std::fmt::Display| StoreError::Corrupt(format!("activity: {e}"));
        let (Some(live), Some(running)) = (items.next(), items.next()) else { return Ok(BTreeMap::new()) };
        let live: Vec<String> = redis::from_redis_value(live).map_err(|e| corrupt(&e))?;
        let running: HashMap<String, String> = redis::from_redis_value(running).map_err(|e| corrupt(&e))?;
        let buckets: Vec<HashMap<String, u64>> =
            items.map(redis::from_redis_value).collect::<Result<_, _>>().map_err(|e| corrupt(&e))?;
        let running: Vec<String> = live.iter().filter_map(|w| running.get(w).cloned()).collect();
        let buckets: Vec<(i64, HashMap<String, u64>)> = window.into_iter().zip(buckets).collect();
        Ok(activity::summarize(now_ms, &buckets, &running))
    }
}
