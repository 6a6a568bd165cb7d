//! Budgets and limits: tool concurrency slots and pacing, circuits and health, provider token budgets, and daily usage.

mod budget;
mod health;
mod slots;
mod usage;

pub use budget::{Spend, Waiter};
pub use health::{CircuitAdmission, CircuitChange, CircuitEvent, ToolHealth, CIRCUIT_HISTORY_MAX};
pub use slots::{Pace, Semaphore, SlotGrant};

use crate::store::client::Redis;

#[derive(Clone)]
pub struct Limits {
    pub(crate) redis: Redis,
}
