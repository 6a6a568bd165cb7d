//! Token usage per tenant, assistant and session (`fleet_protocol::tenant`): one script per model call adds
//! its tokens to the hour's buckets and the tenant's day total in the day's hash (one key, so it
//! works on Redis Cluster), and reads take the buckets of a range of hours in one pipeline.

use crate::store::script::Lua;
use std::collections::BTreeMap;

use fleet_protocol::tenant::{self, UsageBucket, USAGE_TTL_SECS};

use super::Limits;
use crate::store::StoreError;

static RECORD: Lua = Lua::new(|| crate::store::script::load(&[RECORD_LUA]));

/// KEYS: the day's hash. ARGV: its ttl (s), then field, amount pairs.
const RECORD_LUA: &str = include_str!("lua/usage_record.lua");

impl Limits {
    /// Adds one model call's tokens, made at `at_ms`, to its tenant's, assistant's and session's
    /// buckets.
    pub async fn usage_record(
        &self,
        call: tenant::Call<'_>,
        at_ms: i64,
        prompt: u64,
        completion: u64,
    ) -> Result<(), StoreError> {
        let mut inv = RECORD.prepare_invoke();
        inv.key(self.redis.keys.usage_day(tenant::day_of(at_ms))).arg(USAGE_TTL_SECS);
        for (field, n) in tenant::increments(call, at_ms, prompt, completion) {
            inv.arg(field).arg(n);
        }
        let r: Result<i64, _> = inv.invoke_async(&mut self.redis.conn().await?).await;
        self.redis.count(r).map(|_| ())
    }

    /// The tokens `tenant` used on the UTC day of `at_ms` (prompt and completion).
    pub async fn usage_today(&self, tenant: &str, at_ms: i64) -> Result<u64, StoreError> {
        let r: Result<Option<u64>, _> = redis::cmd("HGET")
            .arg(self.redis.keys.usage_day(tenant::day_of(at_ms)))
            .arg(tenant::daily_total_field(tenant))
            .query_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)?.unwrap_or(0))
    }

    /// The buckets of `scope` in `hours` (grouped by day, `tenant::hours`) that saw any usage,
    /// oldest first.
    pub async fn usage_buckets(
        &self,
        scope: tenant::UsageScope<'_>,
        hours: &BTreeMap<i64, Vec<i64>>,
    ) -> Result<Vec<UsageBucket>, StoreError> {
        let mut pipe = redis::pipe();
        for (day, in_day) in hours {
            let cmd = pipe.cmd("HMGET").arg(self.redis.keys.usage_day(*day));
            for hour in in_day {
                cmd.arg(&scope.fields(*hour));
            }
        }
        let r: Result<Vec<Vec<Option<u64>>>, _> = pipe.query_async(&mut self.redis.conn().await?).await;
        let values = self.redis.count(r)?;
        let hourly = hours.values().zip(values).flat_map(|(in_day, vals)| {
            in_day.iter().copied().zip(
                vals.chunks(3).map(|c| [0, 1, 2].map(|i| c.get(i).copied().flatten().unwrap_or(0))).collect::<Vec<_>>(),
            )
        });
        Ok(tenant::buckets(hourly))
    }
}
