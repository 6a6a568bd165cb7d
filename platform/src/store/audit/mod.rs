//! The audit log of operator actions.

mod log;

pub use log::{is_cursor, AuditEntry, AuditEvent, AUDIT_MAX_ENTRIES};

use crate::store::client::Redis;

#[derive(Clone)]
pub struct Audit {
    pub(crate) redis: Redis,
}
