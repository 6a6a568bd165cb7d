//! Approvals: one hash per call waiting for an operator (its state, what it shows, its deadline
//! and the job its decision publishes), indexed by creation time for every tenant and per tenant.
//! Created once by the step that made the call; decided once, only from `pending`.

use fleet_protocol::approvals::{Approval, ApprovalStatus, Decided, APPROVAL_RETENTION_SECS};

use crate::store::client::Redis;
use crate::store::script::Lua;
use crate::store::StoreError;

const CREATE_LUA: &str = include_str!("lua/approval_create.lua");
const DECIDE_LUA: &str = include_str!("lua/approval_decide.lua");
static CREATE: Lua = Lua::new(|| crate::store::script::load(&[CREATE_LUA]));
static DECIDE: Lua = Lua::new(|| crate::store::script::load(&[DECIDE_LUA]));

/// The most approvals one listing reads before filtering by status.
const LIST_SCAN: usize = 1000;

#[derive(Clone)]
pub struct Approvals {
    pub(crate) redis: Redis,
}

/// An approval as stored: the approval, its deadline (ms) and the job (an envelope's JSON) that
/// its decision, or its deadline, lets run.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredApproval {
    pub approval: Approval,
    pub deadline_ms: i64,
    pub job: String,
    /// For a client tool's call: what hands it to the client once approved (JSON).
    pub client: Option<String>,
}

/// What a decision's write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecideWrite {
    /// It was pending: the decision is the approval's now.
    Taken,
    /// It was decided already, so (the write changed nothing).
    Already(ApprovalStatus),
    Missing,
}

impl Approvals {
    /// Creates the approval unless it exists (a copy of the step that made its call); returns
    /// whether it did. It lives until its deadline and `APPROVAL_RETENTION_SECS` after.
    pub async fn create(&self, stored: &StoredApproval, now_ms: i64) -> Result<bool, StoreError> {
        let keys = self.redis.keys();
        let approval = &stored.approval;
        let body = serde_json::to_string(approval).expect("an approval serialises");
        let ttl = (stored.deadline_ms - now_ms).max(0) / 1000 + APPROVAL_RETENTION_SECS as i64;
        let mut conn = self.redis.conn().await?;
        let created: Result<i64, _> = CREATE
            .key(keys.approval(&approval.id))
            .arg(ApprovalStatus::Pending.as_str())
            .arg(body)
            .arg(&stored.job)
            .arg(stored.deadline_ms)
            .arg(ttl)
            .arg(stored.client.as_deref().unwrap_or(""))
            .invoke_async(&mut conn)
            .await;
        let created = self.redis.count(created)? == 1;
        // Indexed apart (another slot); a copy indexes it again, the same entry.
        let oldest = now_ms - ttl * 1000;
        let mut sets = vec![keys.approvals_index(None)];
        sets.extend(approval.tenant.as_deref().map(|t| keys.approvals_index(Some(t))));
        let mut pipe = redis::pipe();
        for set in sets {
            pipe.cmd("ZADD").arg(&set).arg(now_ms).arg(&approval.id).ignore();
            pipe.cmd("ZREMRANGEBYSCORE").arg(&set).arg("-inf").arg(format!("({oldest}")).ignore();
        }
        let indexed: Result<(), _> = pipe.query_async(&mut conn).await;
        self.redis.count(indexed)?;
        Ok(created)
    }

    pub async fn get(&self, id: &str) -> Result<Option<StoredApproval>, StoreError> {
        let r: Result<Vec<Option<String>>, _> = redis::cmd("HMGET")
            .arg(self.redis.keys().approval(id))
            .arg("state")
            .arg("body")
            .arg("decided")
            .arg("deadline_ms")
            .arg("job")
            .arg("client")
            .query_async(&mut self.redis.conn().await?)
            .await;
        let fields = self.redis.count(r)?;
        let [state, body, decided, deadline, job, client] = <[Option<String>; 6]>::try_from(fields)
            .map_err(|_| StoreError::Corrupt(format!("approval {id}: not six fields")))?;
        let (Some(state), Some(body)) = (state, body) else { return Ok(None) };
        let corrupt = |what: &str| StoreError::Corrupt(format!("approval {id}: {what}"));
        let mut approval: Approval = serde_json::from_str(&body).map_err(|e| corrupt(&e.to_string()))?;
        approval.status = ApprovalStatus::parse(&state).ok_or_else(|| corrupt("state"))?;
        approval.decided = decided.and_then(|d| serde_json::from_str::<Decided>(&d).ok());
        let deadline_ms = deadline.and_then(|d| d.parse().ok()).ok_or_else(|| corrupt("deadline"))?;
        let client = client.filter(|c| !c.is_empty());
        Ok(Some(StoredApproval { approval, deadline_ms, job: job.unwrap_or_default(), client }))
    }

    /// Moves a pending approval to `to`, with who decided; any other state is left as it is.
    pub async fn decide(&self, id: &str, to: ApprovalStatus, decided: &Decided) -> Result<DecideWrite, StoreError> {
        let decided = serde_json::to_string(decided).expect("a decision serialises");
        let r: Result<String, _> = DECIDE
            .key(self.redis.keys().approval(id))
            .arg(ApprovalStatus::Pending.as_str())
            .arg(to.as_str())
            .arg(decided)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        Ok(match self.redis.count(r)?.as_str() {
            "taken" => DecideWrite::Taken,
            "missing" => DecideWrite::Missing,
            state => DecideWrite::Already(
                ApprovalStatus::parse(state).ok_or_else(|| StoreError::Corrupt(format!("approval {id}: {state}")))?,
            ),
        })
    }

    /// The newest approvals of `tenant` (every tenant's for `None`) first, up to `limit`, only
    /// those in `status` if given.
    pub async fn list(
        &self,
        tenant: Option<&str>,
        status: Option<ApprovalStatus>,
        limit: usize,
    ) -> Result<Vec<Approval>, StoreError> {
        let r: Result<Vec<String>, _> = redis::cmd("ZREVRANGE")
            .arg(self.redis.keys().approvals_index(tenant))
            .arg(0)
            .arg(LIST_SCAN as i64 - 1)
            .query_async(&mut self.redis.conn().await?)
            .await;
        let mut found = Vec::new();
        for id in self.redis.count(r)? {
            let Some(stored) = self.get(&id).await? else { continue };
            if status.is_none_or(|s| s == stored.approval.status) {
                found.push(stored.approval);
                if found.len() >= limit {
                    break;
                }
            }
        }
        Ok(found)
    }
}
