//! A webhook delivery job: a signed event POSTed to a subscriber, like a callback with no parent.

use fleet_platform::broker::Publisher;
use fleet_protocol::envelope::Envelope;

use crate::process::Processor;
use crate::settle::Outcome;

pub(super) async fn run(p: &Processor, publisher: &Publisher, envelope: &Envelope) -> Outcome {
    super::callback_job::run(p, publisher, envelope, None).await
}
