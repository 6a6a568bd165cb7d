//! Webhook event names and the rules for subscribing to them.

pub const AGENT_ROOM_MESSAGE: &str = "agent.room.message";
pub const TOOL_CALLBACK_FAILED: &str = "tool.callback.failed";
pub const TOOL_CALLBACK_DEAD_LETTER: &str = "tool.callback.dead_letter";
/// Seed 002's `OUTPUT`: a turn's final message delivered to the output sink its assistant names.
/// A webhook lists it to say it is a sink (it answers an `OutputReceipt`); it gets only the
/// deliveries addressed to it.
pub const OUTPUT_DELIVERY: &str = "output.delivery";

/// Every event a webhook may subscribe to.
pub const KNOWN_EVENTS: [&str; 4] =
    [AGENT_ROOM_MESSAGE, TOOL_CALLBACK_FAILED, TOOL_CALLBACK_DEAD_LETTER, OUTPUT_DELIVERY];

/// Webhook delivery timeout (seed: 10 s).
pub const WEBHOOK_TIMEOUT_SECS: u64 = 10;

/// Whether `event` is one a webhook can subscribe to.
pub fn is_known(event: &str) -> bool {
    KNOWN_EVENTS.contains(&event)
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_events_are_the_seeds() {
        assert!(super::is_known("tool.callback.dead_letter"));
        assert!(super::is_known("agent.room.message"));
        assert!(!super::is_known("tool.callback.*"));
    }
}
