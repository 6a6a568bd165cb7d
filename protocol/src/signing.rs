//! HMAC-SHA256 signatures over the raw body, in the seed's `sha256=<hex>` form, and their verification.

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// The `X-Interactor-Signature` value for `body` under `secret`.
pub fn signature_header(secret: &[u8], body: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Why a signed request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("signature header is not of the form sha256=<hex>")]
    Malformed,
    #[error("invalid signature")]
    Mismatch,
    #[error("timestamp is not ISO 8601")]
    BadTimestamp,
    #[error("request too old: {0}s > {1}s")]
    TooOld(i64, i64),
}

/// Verifies as the seed's receivers do: HMAC over the raw body in constant time, and the
/// timestamp within `max_age_secs` of `now_ms`.
pub fn verify(
    secret: &[u8],
    body: &[u8],
    signature: &str,
    timestamp: &str,
    now_ms: i64,
    max_age_secs: i64,
) -> Result<(), VerifyError> {
    let signed_ms = crate::timefmt::millis_from_rfc3339(timestamp).ok_or(VerifyError::BadTimestamp)?;
    let age = (now_ms - signed_ms).abs() / 1000;
    if age > max_age_secs {
        return Err(VerifyError::TooOld(age, max_age_secs));
    }
    let hex_sig = signature.strip_prefix("sha256=").ok_or(VerifyError::Malformed)?;
    let raw = hex::decode(hex_sig).map_err(|_| VerifyError::Malformed)?;
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(body);
    mac.verify_slice(&raw).map_err(|_| VerifyError::Mismatch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_rfc_4231_test_case_2() {
        let sig = signature_header(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(sig, "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn verifies_and_refuses() {
        let body = br#"{"a":1}"#;
        let sig = signature_header(b"s3cret", body);
        let now = 1_768_910_400_000;
        let ts = "2026-01-20T12:00:00Z";
        assert_eq!(verify(b"s3cret", body, &sig, ts, now, 300), Ok(()));
        assert_eq!(verify(b"other", body, &sig, ts, now, 300), Err(VerifyError::Mismatch));
        assert_eq!(verify(b"s3cret", br#"{"a":2}"#, &sig, ts, now, 300), Err(VerifyError::Mismatch));
        assert_eq!(verify(b"s3cret", body, &sig, ts, now + 301_000, 300), Err(VerifyError::TooOld(301, 300)));
        assert_eq!(verify(b"s3cret", body, "md5=00", ts, now, 300), Err(VerifyError::Malformed));
        assert_eq!(verify(b"s3cret", body, &sig, "noon", now, 300), Err(VerifyError::BadTimestamp));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn signatures_verify_and_any_change_breaks_them(
            secret in proptest::collection::vec(any::<u8>(), 1..64),
            body in proptest::collection::vec(any::<u8>(), 0..512),
            flip in any::<proptest::sample::Index>(),
        ) {
            let sig = signature_header(&secret, &body);
            let now = 1_768_910_400_000;
            let ts = "2026-01-20T12:00:00Z";
            prop_assert_eq!(verify(&secret, &body, &sig, ts, now, 300), Ok(()));
            if !body.is_empty() {
                let mut tampered = body.clone();
                tampered[flip.index(body.len())] ^= 0x01;
                prop_assert_eq!(verify(&secret, &tampered, &sig, ts, now, 300), Err(VerifyError::Mismatch));
            }
        }

        #[test]
        fn verify_never_panics_on_arbitrary_headers(sig in "\\PC{0,100}", ts in "\\PC{0,40}") {
            let _ = verify(b"k", b"body", &sig, &ts, 0, 300);
        }
    }
}
