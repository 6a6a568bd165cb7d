//! The executions index, for `GET /v1/executions`: sorted sets of execution ids scored by creation
//! time, one for all and one per kind, tool, room (session) and assistant, all under the
//! `{executions}` tag (one script writes an execution's entries on a Redis Cluster too). Each set is
//! trimmed by age and count as it is written and expires when idle, so the index stays bounded by
//! the retention. A listing reads one set (the narrowest the filter names) a page at a time and
//! checks each candidate against its record, looking at a bounded number of entries per request:
//! nothing scans the keyspace.

use crate::store::script::Lua;
use std::collections::HashMap;

use fleet_protocol::dead_letters::ListCursor;
use fleet_protocol::envelope::JobKind;
use fleet_protocol::execution::{ExecutionRecord, ExecutionStatus};

use super::ConsoleIndex;
use crate::store::connection::evalsha;
use crate::store::{NewExecution, StoreError};

static INDEX: Lua = Lua::new(|| crate::store::script::load(&[INDEX_LUA]));

/// Adds one execution to each set named (all under one tag), drops what is past retention (at
/// most a batch per set, so one write stays cheap) and renews each set's expiry.
/// KEYS: the sets. ARGV: id, score, cutoff (ms), max count, ttl (s), batch.
const INDEX_LUA: &str = include_str!("lua/index.lua");

/// Entries dropped per set and write, at most.
const TRIM_BATCH: u32 = 100;
/// Index entries read per round trip while listing.
const SCAN_PAGE: usize = 200;

pub use crate::config::default_index_retention;

/// Which executions a listing shows. Empty fields match all; times are ms, `until` exclusive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecutionFilter {
    pub status: Option<ExecutionStatus>,
    pub kind: Option<JobKind>,
    pub tool_name: Option<String>,
    pub room_id: Option<String>,
    pub assistant_id: Option<String>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    /// Only this tenant's (a tenant-bound token's listing).
    pub tenant: Option<String>,
}

impl ExecutionFilter {
    /// The set a listing reads: the narrowest dimension the filter names (a room before a tenant
    /// before an assistant before a tool before a kind), else all. The rest is checked on each
    /// record.
    pub fn index_set(&self) -> (&'static str, &str) {
        let named = [
            ("room", self.room_id.as_deref()),
            ("tenant", self.tenant.as_deref()),
            ("assistant", self.assistant_id.as_deref()),
            ("tool", self.tool_name.as_deref()),
            ("kind", self.kind.map(JobKind::as_str)),
        ];
        named.into_iter().find_map(|(dim, v)| v.map(|v| (dim, v))).unwrap_or(("all", ""))
    }

    pub fn matches(&self, e: &ExecutionRecord) -> bool {
        let same = |want: &Option<String>, have: &Option<String>| want.is_none() || want == have;
        self.status.is_none_or(|s| s == e.status)
            && self.kind.is_none_or(|k| k == e.kind)
            && same(&self.tool_name, &e.tool_name)
            && same(&self.room_id, &e.room_id)
            && same(&self.assistant_id, &e.assistant_id)
            && same(&self.tenant, &e.tenant)
            && self.since_ms.is_none_or(|s| e.created_at_ms >= s)
            && self.until_ms.is_none_or(|u| e.created_at_ms < u)
    }
}

/// The sets a new execution is entered in.
pub fn index_sets(e: &NewExecution<'_>) -> Vec<(&'static str, String)> {
    let mut sets = vec![("all", String::new()), ("kind", e.kind.as_str().to_string())];
    for (dim, value) in
        [("tool", e.tool_name), ("room", e.room_id), ("assistant", e.assistant_id), ("tenant", e.tenant)]
    {
        if let Some(v) = value {
            sets.push((dim, v.to_string()));
        }
    }
    sets
}

/// A listing's entry: the record, if it is there and reads.
fn summary(id: &str, hash: &HashMap<String, String>) -> Option<ExecutionRecord> {
    ExecutionRecord::from_fields(id, hash).ok()
}

impl ConsoleIndex {
    /// The script that enters a new execution in the index (one script on the index's slot).
    pub(crate) fn index_call(&self, e: &NewExecution<'_>) -> (&'static redis::Script, redis::Cmd) {
        let policy = self.retention;
        let sets = index_sets(e);
        let mut cmd = evalsha(&INDEX, sets.len());
        for (dim, value) in sets {
            cmd.arg(self.redis.keys().executions_index(dim, &value));
        }
        cmd.arg(e.execution_id)
            .arg(e.now_ms)
            .arg(policy.cutoff_ms(e.now_ms))
            .arg(policy.max_count)
            .arg((policy.max_age_ms / 1000).max(1))
            .arg(TRIM_BATCH);
        (&INDEX, cmd)
    }

    /// One page of the newest-first listing: up to `limit` executions matching `filter` after
    /// `cursor`, looking at no more than `budget` index entries. The cursor returned continues the
    /// listing (also when the budget ran out first); `None` means the end.
    pub async fn list_executions(
        &self,
        filter: &ExecutionFilter,
        cursor: Option<ListCursor>,
        limit: usize,
        budget: usize,
    ) -> Result<(Vec<ExecutionRecord>, Option<ListCursor>), StoreError> {
        let (dim, value) = filter.index_set();
        let set = &self.redis.keys().executions_index(dim, value);
        crate::store::scan::newest_first(cursor, limit, budget, SCAN_PAGE, |cursor, want| async move {
            let entries = self.executions_index_page(set, filter, cursor.as_ref(), want).await?;
            let records = self.execution_hashes(entries.iter().map(|(id, _)| id.as_str())).await?;
            let page = entries.into_iter().zip(records).map(|((id, at), hash)| {
                let listed = summary(&id, &hash).filter(|s| filter.matches(s));
                (ListCursor { at_ms: at, id }, listed)
            });
            Ok(page.collect())
        })
        .await
    }

    /// How many executions of one set (`all`, `kind:<kind>`, …) were created since `since_ms`.
    pub async fn executions_since(&self, set: &str, since_ms: i64) -> Result<u64, StoreError> {
        let (dim, value) = set.split_once(':').unwrap_or((set, ""));
        let r: Result<u64, _> = redis::cmd("ZCOUNT")
            .arg(self.redis.keys().executions_index(dim, value))
            .arg(since_ms)
            .arg("+inf")
            .query_async(&mut self.redis.conn().await?)
            .await;
        self.redis.count(r)
    }

    /// Index entries of `set` newest first, within the filter's time range, after `cursor`.
    async fn executions_index_page(
        &self,
        set: &str,
        filter: &ExecutionFilter,
        cursor: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let upper = filter.until_ms.map(|u| u - 1).unwrap_or(i64::MAX);
        let max = cursor.map_or(upper, |c| c.at_ms.min(upper));
        let min = filter.since_ms.map(|s| s.to_string()).unwrap_or_else(|| "-inf".into());
        self.redis.zset_newest_first(set, &max.to_string(), &min, cursor, limit).await
    }

    /// The record hashes of `ids` (empty where there is none), read concurrently: each lives in
    /// its own slot, and the connection pipelines concurrent requests.
    async fn execution_hashes<'a>(
        &self,
        ids: impl Iterator<Item = &'a str>,
    ) -> Result<Vec<HashMap<String, String>>, StoreError> {
        let conn = self.redis.conn().await?;
        let reads = ids.map(|id| {
            let mut conn = conn.clone();
            let key = self.redis.keys().execution(id);
            async move { redis::cmd("HGETALL").arg(key).query_async::<HashMap<String, String>>(&mut conn).await }
        });
        futures::future::join_all(reads).await.into_iter().map(|r| self.redis.count(r)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary_of(status: ExecutionStatus, tool: Option<&str>, room: Option<&str>, at: i64) -> ExecutionRecord {
        ExecutionRecord {
            execution_id: "exec_1".into(),
            kind: JobKind::ToolCall,
            status,
            tool_name: tool.map(Into::into),
            room_id: room.map(Into::into),
            assistant_id: None,
            tenant: None,
            created_at_ms: at,
            updated_at_ms: at,
            run_at_ms: None,
            attempts: 1,
            last_error: None,
        }
    }

    #[test]
    fn a_listing_reads_the_narrowest_set_the_filter_names() {
        assert_eq!(ExecutionFilter::default().index_set(), ("all", ""));
        let f = ExecutionFilter { kind: Some(JobKind::Turn), tool_name: Some("search".into()), ..Default::default() };
        assert_eq!(f.index_set(), ("tool", "search"));
        let f = ExecutionFilter { room_id: Some("room_1".into()), ..f };
        assert_eq!(f.index_set(), ("room", "room_1"));
        let f = ExecutionFilter { status: Some(ExecutionStatus::Failed), ..Default::default() };
        assert_eq!(f.index_set(), ("all", ""), "a status is checked on the record");
    }

    #[test]
    fn every_field_of_the_filter_is_checked_on_the_record() {
        let e = summary_of(ExecutionStatus::Succeeded, Some("search"), Some("room_1"), 1_000);
        assert!(ExecutionFilter::default().matches(&e));
        assert!(!ExecutionFilter { status: Some(ExecutionStatus::Failed), ..Default::default() }.matches(&e));
        assert!(!ExecutionFilter { tool_name: Some("other".into()), ..Default::default() }.matches(&e));
        assert!(!ExecutionFilter { room_id: Some("room_2".into()), ..Default::default() }.matches(&e));
        assert!(!ExecutionFilter { kind: Some(JobKind::Turn), ..Default::default() }.matches(&e));
        assert!(ExecutionFilter { since_ms: Some(1_000), until_ms: Some(1_001), ..Default::default() }.matches(&e));
        assert!(!ExecutionFilter { until_ms: Some(1_000), ..Default::default() }.matches(&e), "until is exclusive");
    }

    #[test]
    fn a_new_execution_enters_all_its_kind_and_the_dimensions_it_has() {
        let e = NewExecution {
            execution_id: "exec_1",
            kind: JobKind::Turn,
            tool_name: None,
            room_id: Some("room_1"),
            assistant_id: Some("asst_1"),
            tenant: None,
            now_ms: 5,
            run_at_ms: None,
        };
        let sets: Vec<(&str, String)> = index_sets(&e);
        assert_eq!(
            sets,
            vec![
                ("all", "".into()),
                ("kind", "turn".into()),
                ("room", "room_1".into()),
                ("assistant", "asst_1".into())
            ]
        );
    }
}
