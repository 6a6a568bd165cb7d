//! Execution records and their life: the record, the fenced claim and each step's transition, `Idempotency-Key` reservations and cancels.

mod cancel;
mod life;
mod records;
mod requests;

pub use cancel::CancelRequest;
pub use fleet_protocol::execution::NewExecution;
pub use life::{
    record_ttl_secs, AdmitMode, Begin, ClaimAfter, Created, Delivery, DeliveryClaim, Expected, Fence, Transition,
    PARK_SLACK,
};
pub(crate) use records::execution_view;
pub use records::ExecutionView;
pub use requests::{RequestHold, Reservation};

use crate::store::client::Redis;
use crate::store::ConsoleIndex;

#[derive(Clone)]
pub struct Executions {
    pub(crate) redis: Redis,
    /// A new record enters the executions index in the same round trip as its creation.
    pub(crate) index: ConsoleIndex,
}
