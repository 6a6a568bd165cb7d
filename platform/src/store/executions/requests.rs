//! A client's `Idempotency-Key`: reserved for one request's execution, confirmed once the broker
//! confirmed the job, released when nothing was sent, abandoned when unsure (the next request with
//! the key publishes the same execution again). Each write swaps only the value its writer made.

use crate::store::script::Lua;
use std::time::Duration;

use redis::AsyncCommands;

use fleet_protocol::idempotency::{decide, Decision, RequestRecord, RequestState};
use fleet_protocol::IDEMPOTENCY_TTL_SECS;

use super::Executions;
use crate::store::StoreError;

/// What `reserve_request` found for a client's `Idempotency-Key`.
#[derive(Debug, Clone, PartialEq)]
pub enum Reservation {
    /// First use: the caller holds the key and must publish, then `confirm_request` (or
    /// `release_request` if the job certainly was not sent, `abandon_request` if unsure).
    New(RequestHold),
    /// A previous request with this key was accepted as this execution.
    Existing(String),
    /// A request with this key is being accepted right now.
    InProgress,
    /// A previous request reserved this execution but its publish was never confirmed: the caller
    /// now holds the key and must publish the same execution again.
    Unconfirmed(RequestHold),
    /// The key was used before with a different body.
    Reused,
}

/// A request's hold on its key: the exact value it wrote, so that it only undoes its own write.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestHold {
    key: String,
    raw: String,
    pub record: RequestRecord,
}

impl RequestHold {
    pub fn execution_id(&self) -> &str {
        &self.record.execution_id
    }
}

/// Replaces the value only if it is still exactly `ARGV[1]` (an empty `ARGV[2]` deletes it).
const SWAP_LUA: &str = include_str!("lua/swap.lua");

static SWAP: Lua = Lua::new(|| crate::store::script::load(&[SWAP_LUA]));

impl Executions {
    /// Reserves `key` for a request with `body_digest`: a new key goes to `execution_id`, pending
    /// for `pending_for` (then a crashed request's reservation is abandoned); an existing one is
    /// decided by `idempotency::decide`. Times are this process's clock.
    pub async fn reserve_request(
        &self,
        key: &str,
        execution_id: &str,
        body_digest: &str,
        pending_for: Duration,
    ) -> Result<Reservation, StoreError> {
        // Two requests racing to take over one abandoned key: the loser sees the winner's hold.
        for _ in 0..3 {
            let now = crate::now_ms();
            let until = now + pending_for.as_millis() as i64;
            let fresh = RequestRecord::pending(execution_id, body_digest, until, rand::random());
            let raw = fresh.to_json();
            let r: Result<(Option<String>, String), _> = redis::pipe()
                .cmd("SET")
                .arg(key)
                .arg(&raw)
                .arg("NX")
                .arg("EX")
                .arg(IDEMPOTENCY_TTL_SECS)
                .get(key)
                .query_async(&mut self.redis.conn().await?)
                .await;
            let (set, current) = self.redis.count(r)?;
            if set.is_some() {
                return Ok(Reservation::New(RequestHold { key: key.into(), raw, record: fresh }));
            }
            let stored = RequestRecord::parse(&current).map_err(StoreError::Corrupt)?;
            match decide(&stored, body_digest, now) {
                Decision::Replay(id) => return Ok(Reservation::Existing(id)),
                Decision::InProgress => return Ok(Reservation::InProgress),
                Decision::Reused => return Ok(Reservation::Reused),
                Decision::Republish(_) => {
                    let record = stored.with_state(RequestState::Pending, until, rand::random());
                    let hold = RequestHold { key: key.into(), raw: record.to_json(), record };
                    if self.swap_request(key, &current, Some(&hold.raw)).await? {
                        return Ok(Reservation::Unconfirmed(hold));
                    }
                }
            }
        }
        Ok(Reservation::InProgress)
    }

    async fn swap_request(&self, key: &str, expected: &str, new: Option<&str>) -> Result<bool, StoreError> {
        let r: Result<i64, _> = SWAP
            .key(key)
            .arg(expected)
            .arg(new.unwrap_or(""))
            .arg(IDEMPOTENCY_TTL_SECS)
            .invoke_async(&mut self.redis.conn().await?)
            .await;
        Ok(self.redis.count(r)? == 1)
    }

    /// The broker confirmed the held execution: the key answers it for 7 days.
    pub async fn confirm_request(&self, hold: &RequestHold) -> Result<(), StoreError> {
        let record = hold.record.with_state(RequestState::Confirmed, 0, hold.record.hold);
        let r: Result<(), _> = self.redis.conn().await?.set_ex(&hold.key, record.to_json(), IDEMPOTENCY_TTL_SECS).await;
        self.redis.count(r)
    }

    /// The held execution was certainly not sent: the key is free again, unless another request
    /// took it over meanwhile (then `false`).
    pub async fn release_request(&self, hold: &RequestHold) -> Result<bool, StoreError> {
        self.swap_request(&hold.key, &hold.raw, None).await
    }

    /// A batch accepted in part: the indices of its jobs the broker confirmed, kept beside its key
    /// so that a retry with the key publishes only the others.
    pub async fn note_batch_confirmed(&self, hold: &RequestHold, indices: &[usize]) -> Result<(), StoreError> {
        let key = format!("{}:confirmed", hold.key);
        let mut pipe = redis::pipe();
        if !indices.is_empty() {
            pipe.sadd(&key, indices).ignore();
        }
        let r: Result<(), _> =
            pipe.expire(&key, IDEMPOTENCY_TTL_SECS as i64).ignore().query_async(&mut self.redis.conn().await?).await;
        self.redis.count(r)
    }

    /// The indices `note_batch_confirmed` kept for the batch `hold` takes over (empty if none).
    pub async fn batch_confirmed(&self, hold: &RequestHold) -> Result<std::collections::HashSet<usize>, StoreError> {
        let r: Result<std::collections::HashSet<usize>, _> =
            self.redis.conn().await?.smembers(format!("{}:confirmed", hold.key)).await;
        self.redis.count(r)
    }

    /// The held execution may or may not be on the queue: the key keeps naming it, and the next
    /// request with it publishes it again at once instead of waiting for the reservation to expire.
    pub async fn abandon_request(&self, hold: &RequestHold) -> Result<(), StoreError> {
        let record = hold.record.with_state(RequestState::Unconfirmed, 0, hold.record.hold);
        self.swap_request(&hold.key, &hold.raw, Some(&record.to_json())).await.map(|_| ())
    }
}
