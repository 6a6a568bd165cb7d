//! Dead letters: the records, their index by time and reason, locks while a replay runs, and the retention.

mod letters;

use fleet_protocol::dead_letters::Retention;

use crate::store::client::Redis;
use crate::store::Executions;

#[derive(Clone)]
pub struct DeadLetters {
    pub(crate) redis: Redis,
    /// A dead letter is stamped with its execution's tenant.
    pub(crate) executions: Executions,
    /// How long and how many entries are kept.
    pub(crate) retention: Retention,
}
