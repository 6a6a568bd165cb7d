//! A webhook delivery job: a signed event POSTed to a subscriber, like a callback with no parent.

use fleet_protocol::envelope::Envelope;

use crate::context::Cx;
use crate::outcome::Outcome;

pub(super) async fn run(cx: &Cx<'_>, envelope: &Envelope) -> Outcome {
    super::callback_job::run(cx, envelope, None).await
}
