//! What the console and the executions listing read: the executions index, console logins and jobs, and worker activity.

mod activity;
mod index;
mod logins;

pub use activity::ActivityReport;
pub use index::{default_index_retention, ExecutionFilter};

use fleet_protocol::dead_letters::Retention;

use crate::store::client::Redis;

#[derive(Clone)]
pub struct ConsoleIndex {
    pub(crate) redis: Redis,
    /// How long and how many entries are kept.
    pub(crate) retention: Retention,
}
