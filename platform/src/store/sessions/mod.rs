//! Turns and sessions: a turn's state and round reports, a session's queue, holder and binding, its event stream, history, message log, artifacts' records and listening surfaces.

mod artifacts;
mod events;
mod history;
mod message_log;
mod surfaces;
mod turns;

pub use events::SessionEventSubscription;
pub use message_log::MAX_LOGGED_MESSAGES;
pub use turns::{CompactHistory, Opened, RoundReport, RoundState, SessionFinish, SessionHolders, SessionSlot};

use crate::store::client::Redis;
use crate::store::Executions;

#[derive(Clone)]
pub struct Sessions {
    pub(crate) redis: Redis,
    /// A turn is an execution: its record is read with its state.
    pub(crate) executions: Executions,
}
