//! Seed 002's `OUTPUT`: the delivery a turn's output sink receives (`{deliveryId, message,
//! artifacts}`) and what the sink's `OutputReceipt` means for the delivery.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::external_result::{InteractionError, ResultReference};

/// Seed 002's `Artifact`: a reference delivered with a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveredArtifact {
    pub name: String,
    pub reference: ResultReference,
}

/// The sink's receipt for one delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputReceipt {
    pub delivery_id: String,
    pub status: ReceiptStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<Vec<DeliveredArtifact>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<InteractionError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptStatus {
    Accepted,
    Rejected,
    Unknown,
}

/// The body a sink receives: the turn's final message as seed 002's assistant `Message`.
pub fn delivery_payload(delivery_id: &str, content: &Value, artifacts: &[DeliveredArtifact]) -> Value {
    let mut payload = json!({"deliveryId": delivery_id, "message": {"role": "assistant", "content": content}});
    if !artifacts.is_empty() {
        payload["artifacts"] = json!(artifacts);
    }
    payload
}

/// What a sink's 2xx answer means for its delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum ReceiptVerdict {
    /// Delivered: the receipt is the delivery's result.
    Accepted(Value),
    /// Try again later with the same `deliveryId` (the sink's key to deduplicate).
    Retry(String),
    /// Never accepted: dead-lettered, naming why.
    Refused(String),
}

/// Reads the sink's answer to delivery `delivery_id`: `accepted` is a success; `unknown`, or a
/// `rejected` receipt whose error says `retryable`, is tried again; any other `rejected`, a
/// receipt for another delivery, or an answer that is not a receipt is refused.
pub fn judge_receipt(delivery_id: &str, body: &[u8]) -> ReceiptVerdict {
    let receipt: OutputReceipt = match serde_json::from_slice(body) {
        Ok(receipt) => receipt,
        Err(e) => return ReceiptVerdict::Refused(format!("the sink's answer is not an OutputReceipt: {e}")),
    };
    if receipt.delivery_id != delivery_id {
        return ReceiptVerdict::Refused(format!(
            "the sink's receipt names delivery {:?}, not {delivery_id:?}",
            receipt.delivery_id
        ));
    }
    let why = |status: &str| match &receipt.error {
        Some(e) => format!("the sink answered {status}: {}: {}", e.code, e.message),
        None => format!("the sink answered {status}"),
    };
    match receipt.status {
        ReceiptStatus::Accepted => ReceiptVerdict::Accepted(serde_json::to_value(&receipt).unwrap_or(Value::Null)),
        ReceiptStatus::Unknown => ReceiptVerdict::Retry(why("unknown")),
        ReceiptStatus::Rejected if receipt.error.as_ref().and_then(|e| e.retryable) == Some(true) => {
            ReceiptVerdict::Retry(why("rejected"))
        }
        ReceiptStatus::Rejected => ReceiptVerdict::Refused(why("rejected")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_by_status() {
        let accepted = br#"{"deliveryId":"d1","status":"accepted"}"#;
        assert!(matches!(judge_receipt("d1", accepted), ReceiptVerdict::Accepted(r) if r["status"] == "accepted"));
        assert!(matches!(judge_receipt("d1", br#"{"deliveryId":"d1","status":"unknown"}"#), ReceiptVerdict::Retry(_)));
        let rejected =
            br#"{"deliveryId":"d1","status":"rejected","error":{"code":"DELIVERY_REJECTED","message":"no"}}"#;
        assert_eq!(
            judge_receipt("d1", rejected),
            ReceiptVerdict::Refused("the sink answered rejected: DELIVERY_REJECTED: no".into())
        );
        let busy =
            br#"{"deliveryId":"d1","status":"rejected","error":{"code":"BUSY","message":"later","retryable":true}}"#;
        assert!(matches!(judge_receipt("d1", busy), ReceiptVerdict::Retry(_)));
    }

    #[test]
    fn a_mismatched_or_missing_receipt_is_refused() {
        let other = judge_receipt("d1", br#"{"deliveryId":"d2","status":"accepted"}"#);
        assert_eq!(other, ReceiptVerdict::Refused(r#"the sink's receipt names delivery "d2", not "d1""#.into()));
        assert!(matches!(judge_receipt("d1", b"OK"), ReceiptVerdict::Refused(e) if e.contains("not an OutputReceipt")));
    }

    #[test]
    fn the_payload_is_the_seeds() {
        assert_eq!(
            delivery_payload("d1", &json!("Done."), &[]),
            json!({"deliveryId": "d1", "message": {"role": "assistant", "content": "Done."}})
        );
    }
}
