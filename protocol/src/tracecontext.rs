//! W3C trace context (`traceparent`) carried from the API request through AMQP headers to the
//! worker's outgoing HTTP calls, so one trace id follows a job end to end.

use rand::RngCore;

/// AMQP header and HTTP header name.
pub const TRACEPARENT: &str = "traceparent";

/// A parsed `traceparent`: version 00, 16-byte trace id, 8-byte parent span id, flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` value; invalid or all-zero ids give `None` (start a new trace).
    pub fn parse(text: &str) -> Option<Self> {
        let parts: Vec<&str> = text.trim().split('-').collect();
        if parts.len() < 4 || parts[0].len() != 2 || parts[0] == "ff" {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        let mut flags = [0u8; 1];
        hex::decode_to_slice(parts[1], &mut trace_id).ok()?;
        hex::decode_to_slice(parts[2], &mut span_id).ok()?;
        hex::decode_to_slice(parts[3], &mut flags).ok()?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent { trace_id, span_id, flags: flags[0] })
    }

    /// A new sampled trace.
    pub fn new_root() -> Self {
        let mut trace_id = [0u8; 16];
        rand::rng().fill_bytes(&mut trace_id);
        TraceParent { trace_id, span_id: new_span_id(), flags: 1 }
    }

    /// The same trace with a new span id: the context to send downstream.
    pub fn child(&self) -> Self {
        TraceParent { span_id: new_span_id(), ..*self }
    }

    pub fn trace_id_hex(&self) -> String {
        hex::encode(self.trace_id)
    }
}

impl std::fmt::Display for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "00-{}-{}-{:02x}", hex::encode(self.trace_id), hex::encode(self.span_id), self.flags)
    }
}

fn new_span_id() -> [u8; 8] {
    let mut id = [0u8; 8];
    while id == [0; 8] {
        rand::rng().fill_bytes(&mut id);
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_w3c_example_and_keeps_the_trace_in_children() {
        let tp = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(tp.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let child = tp.child();
        assert_eq!(child.trace_id, tp.trace_id);
        assert_ne!(child.span_id, tp.span_id);
        assert!(child.to_string().starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert!(child.to_string().ends_with("-01"));
    }

    #[test]
    fn refuses_invalid_values() {
        for bad in [
            "",
            "00-abc-def-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
        let root = TraceParent::new_root();
        assert_eq!(TraceParent::parse(&root.to_string()), Some(root));
    }
}
