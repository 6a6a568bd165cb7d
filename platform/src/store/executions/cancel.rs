//! Cancelling an execution (`POST /v1/executions/{id}/cancel`): the dispatcher's one atomic
//! decision on the record, and the worker's cheap reads of it. A tool call or webhook delivery is
//! cancelled only while nothing of it is being sent (`queued`, or `retrying` between attempts); its
//! attempt's `running` write (the claim's, or `begin_attempt`) and the cancel are decided by the
//! record's scripts, so exactly one of them wins. A turn is only marked (`cancel_requested`): its next step ends it.

use crate::store::script::Lua;
use fleet_protocol::execution::{field, ExecutionStatus};

use super::Executions;
use crate::store::StoreError;

static CANCEL_SCRIPT: Lua = Lua::new(|| crate::store::script::load(&[CANCEL_LUA]));

// KEYS: the execution record. ARGV: now (ms). Answers {verdict, detail}:
// missing; finished + status; sent + status; cancelled + the status it had; requested + status.
const CANCEL_LUA: &str = include_str!("lua/cancel.lua");

/// What a cancel request found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelRequest {
    /// No such execution.
    Missing,
    /// It had already ended with this status: nothing to cancel.
    Finished(ExecutionStatus),
    /// A tool call or webhook whose attempt is being sent (or polled): it cannot be unsent.
    AlreadySent(ExecutionStatus),
    /// Now `cancelled`; `before` is the status it had (`retrying`: an earlier attempt was sent;
    /// `cancelled`: it already was).
    Cancelled { before: ExecutionStatus },
    /// A turn, marked: it ends before its next model call. `status` is its status now.
    Requested(ExecutionStatus),
}

impl Executions {
    /// Cancels `execution_id` if nothing of it is being sent (see `CANCEL_LUA`).
    pub async fn request_cancel(&self, execution_id: &str, now_ms: i64) -> Result<CancelRequest, StoreError> {
        let r: Result<(String, String), _> = CANCEL_SCRIPT
            .key(self.redis.keys.execution(execution_id))
            .arg(now_ms)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        let (verdict, detail) = self.redis.count(r)?;
        let status = || {
            ExecutionStatus::parse(&detail)
                .ok_or_else(|| StoreError::Corrupt(format!("execution {execution_id}: status {detail:?}")))
        };
        Ok(match verdict.as_str() {
            "missing" => CancelRequest::Missing,
            "finished" => CancelRequest::Finished(status()?),
            "sent" => CancelRequest::AlreadySent(status()?),
            "cancelled" => CancelRequest::Cancelled { before: status()? },
            "requested" => CancelRequest::Requested(status()?),
            other => return Err(StoreError::Corrupt(format!("cancel script answered {other}"))),
        })
    }

    /// Whether a client asked to cancel the execution (one field read).
    pub async fn cancel_requested(&self, execution_id: &str) -> Result<bool, StoreError> {
        let r: Result<Option<String>, _> = redis::cmd("HGET")
            .arg(self.redis.keys.execution(execution_id))
            .arg(field::CANCEL_REQUESTED)
            .query_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)?.is_some())
    }
}
