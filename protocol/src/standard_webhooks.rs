//! Standard Webhooks signatures (<https://www.standardwebhooks.com>): HMAC-SHA256 over
//! `{webhook-id}.{webhook-timestamp}.{body}`, sent as `webhook-signature: v1,<base64>` (several
//! signatures space-separated, as during a secret rotation), and their verification.
//!
//! The key is what the spec's reference libraries take from a secret: an optional `whsec_` prefix
//! is dropped and the rest is decoded as standard base64. The fleet derives the key the same way,
//! so an owner who hands the secret they registered to a reference library (`Webhook::new(secret)`,
//! `Webhook(secret)`) verifies our signatures.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::Mac;

use crate::signing::HmacSha256;

pub const ID_HEADER: &str = "webhook-id";
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "webhook-signature";
/// The prefix the spec gives secrets; optional in what a reference library accepts.
pub const SECRET_PREFIX: &str = "whsec_";
/// The spec's recommended tolerance between the signing time and the receiver's clock.
pub const TOLERANCE_SECS: i64 = 5 * 60;
/// The spec's lower bound for a secret key ("between 24 bytes and 64 bytes"); new registrations
/// must meet it, the upper bound is not enforced (a longer key is no weaker).
pub const MIN_KEY_BYTES: usize = 24;
const VERSION: &str = "v1";

/// Why a secret cannot be a Standard Webhooks key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error(
        "a standard-webhooks secret must be base64, optionally prefixed with whsec_ (as the spec's libraries read it)"
    )]
    NotBase64,
    #[error("a standard-webhooks secret must decode to at least {MIN_KEY_BYTES} bytes, this one decodes to {0}")]
    TooShort(usize),
}

/// The HMAC key a reference library derives from `secret`: `whsec_` dropped, base64 decoded.
pub fn key_from_secret(secret: &str) -> Result<Vec<u8>, KeyError> {
    let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
    STANDARD.decode(encoded).map_err(|_| KeyError::NotBase64)
}

/// Whether `secret` may be registered for the Standard Webhooks scheme: it decodes, and to a key
/// of at least [`MIN_KEY_BYTES`].
pub fn check_new_secret(secret: &str) -> Result<(), KeyError> {
    let key = key_from_secret(secret)?;
    if key.len() < MIN_KEY_BYTES {
        return Err(KeyError::TooShort(key.len()));
    }
    Ok(())
}

/// One signature, `v1,<base64>`, over `{id}.{timestamp}.{body}` under `key`.
pub fn sign(key: &[u8], id: &str, timestamp_secs: i64, body: &[u8]) -> String {
    format!("{VERSION},{}", STANDARD.encode(mac(key, id, timestamp_secs, body)))
}

/// The `webhook-signature` value: one signature per key, space-separated, in the keys' order.
pub fn signature_header(keys: &[Vec<u8>], id: &str, timestamp_secs: i64, body: &[u8]) -> String {
    keys.iter().map(|key| sign(key, id, timestamp_secs, body)).collect::<Vec<_>>().join(" ")
}

fn mac(key: &[u8], id: &str, timestamp_secs: i64, body: &[u8]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp_secs.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize().into_bytes().into()
}

/// Why a Standard Webhooks request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StandardVerifyError {
    #[error("webhook-timestamp is not a number of seconds")]
    BadTimestamp,
    #[error("webhook-timestamp is {0}s too old")]
    TooOld(i64),
    #[error("webhook-timestamp is {0}s in the future")]
    TooNew(i64),
    #[error("no v1 signature in webhook-signature matches")]
    Mismatch,
}

/// Verifies as the spec's receivers do: the timestamp within [`TOLERANCE_SECS`] of `now_secs`
/// either way, and any `v1` entry of `signatures` matching (in constant time); other versions
/// and malformed entries are ignored.
pub fn verify(
    key: &[u8],
    id: &str,
    timestamp: &str,
    signatures: &str,
    body: &[u8],
    now_secs: i64,
) -> Result<(), StandardVerifyError> {
    let signed_at: i64 = timestamp.trim().parse().map_err(|_| StandardVerifyError::BadTimestamp)?;
    if now_secs - signed_at > TOLERANCE_SECS {
        return Err(StandardVerifyError::TooOld(now_secs - signed_at));
    }
    if signed_at - now_secs > TOLERANCE_SECS {
        return Err(StandardVerifyError::TooNew(signed_at - now_secs));
    }
    let matches = signatures
        .split(' ')
        .filter_map(|entry| entry.split_once(','))
        .filter(|(version, _)| *version == VERSION)
        .filter_map(|(_, encoded)| STANDARD.decode(encoded).ok())
        .any(|raw| {
            let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length");
            mac.update(format!("{id}.{signed_at}.").as_bytes());
            mac.update(body);
            mac.verify_slice(&raw).is_ok()
        });
    matches.then_some(()).ok_or(StandardVerifyError::Mismatch)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Published test vectors: the reference libraries' `sign` tests (JavaScript and Python suites,
    // and the Rust crate's) in the spec repository.
    const JS_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const JS_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const JS_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const JS_TIMESTAMP: i64 = 1_614_265_330;
    const JS_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    #[test]
    fn signs_the_published_vectors() {
        let key = key_from_secret(JS_SECRET).unwrap();
        assert_eq!(sign(&key, JS_ID, JS_TIMESTAMP, JS_BODY), JS_SIGNATURE);
        let key = key_from_secret("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        let body = br#"{"email":"test@example.com","username":"test_user"}"#;
        assert_eq!(
            sign(&key, "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk", 1_649_367_553, body),
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
        );
    }

    #[test]
    fn the_prefix_is_optional_as_in_the_reference_libraries() {
        assert_eq!(key_from_secret(JS_SECRET), key_from_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"));
        assert_eq!(key_from_secret(JS_SECRET).unwrap().len(), 24);
        assert_eq!(key_from_secret("whsec_not base64!"), Err(KeyError::NotBase64));
        assert_eq!(check_new_secret(JS_SECRET), Ok(()));
        assert_eq!(check_new_secret("whsec_c2hvcnQtc2VjcmV0LWtleQ=="), Err(KeyError::TooShort(16)));
        assert_eq!(check_new_secret("a plain passphrase of some length"), Err(KeyError::NotBase64));
    }

    #[test]
    fn verifies_the_published_cases() {
        let key = key_from_secret(JS_SECRET).unwrap();
        let now = JS_TIMESTAMP + 10;
        let ts = JS_TIMESTAMP.to_string();
        let check = |sigs: &str| verify(&key, JS_ID, &ts, sigs, JS_BODY, now);
        assert_eq!(check(JS_SIGNATURE), Ok(()));
        // "multi sig payload is valid": other versions and wrong v1 entries are passed over.
        let bogus = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=";
        let v2 = "v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=";
        assert_eq!(check(&format!("{bogus} {v2} {JS_SIGNATURE} {bogus}")), Ok(()));
        assert_eq!(check(&format!("{bogus} {v2}")), Err(StandardVerifyError::Mismatch));
        // "invalid signature" and "partial signature".
        assert_eq!(check("v1,dawfeoifkpqwoekfpqoekf"), Err(StandardVerifyError::Mismatch));
        assert_eq!(check(&JS_SIGNATURE[..8]), Err(StandardVerifyError::Mismatch));
        assert_eq!(check("v1,"), Err(StandardVerifyError::Mismatch));
        assert_eq!(check(""), Err(StandardVerifyError::Mismatch));
        // "invalid timestamp", "old timestamp fails", "new timestamp fails".
        assert_eq!(verify(&key, JS_ID, "hello", JS_SIGNATURE, JS_BODY, now), Err(StandardVerifyError::BadTimestamp));
        let late = JS_TIMESTAMP + TOLERANCE_SECS + 1;
        assert_eq!(verify(&key, JS_ID, &ts, JS_SIGNATURE, JS_BODY, late), Err(StandardVerifyError::TooOld(301)));
        let early = JS_TIMESTAMP - TOLERANCE_SECS - 1;
        assert_eq!(verify(&key, JS_ID, &ts, JS_SIGNATURE, JS_BODY, early), Err(StandardVerifyError::TooNew(301)));
        // The id and the body are signed.
        assert_eq!(verify(&key, "msg_other", &ts, JS_SIGNATURE, JS_BODY, now), Err(StandardVerifyError::Mismatch));
        assert_eq!(verify(&key, JS_ID, &ts, JS_SIGNATURE, b"{}", now), Err(StandardVerifyError::Mismatch));
    }

    #[test]
    fn a_header_carries_one_signature_per_key_each_verifying_alone() {
        let new = key_from_secret("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        let old = key_from_secret(JS_SECRET).unwrap();
        let header = signature_header(&[new.clone(), old.clone()], JS_ID, JS_TIMESTAMP, JS_BODY);
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts, [sign(&new, JS_ID, JS_TIMESTAMP, JS_BODY), JS_SIGNATURE.to_string()]);
        let ts = JS_TIMESTAMP.to_string();
        for key in [&new, &old] {
            assert_eq!(verify(key, JS_ID, &ts, &header, JS_BODY, JS_TIMESTAMP), Ok(()));
        }
        assert_eq!(
            verify(b"third key", JS_ID, &ts, &header, JS_BODY, JS_TIMESTAMP),
            Err(StandardVerifyError::Mismatch)
        );
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn signatures_verify_and_any_change_breaks_them(
            key in proptest::collection::vec(any::<u8>(), 1..64),
            body in proptest::collection::vec(any::<u8>(), 0..256),
            flip in any::<proptest::sample::Index>(),
        ) {
            let header = sign(&key, "exec_1", 1_700_000_000, &body);
            prop_assert_eq!(verify(&key, "exec_1", "1700000000", &header, &body, 1_700_000_000), Ok(()));
            if !body.is_empty() {
                let mut tampered = body.clone();
                tampered[flip.index(body.len())] ^= 0x01;
                prop_assert_eq!(
                    verify(&key, "exec_1", "1700000000", &header, &tampered, 1_700_000_000),
                    Err(StandardVerifyError::Mismatch)
                );
            }
        }

        #[test]
        fn verify_never_panics_on_arbitrary_headers(sigs in "\\PC{0,120}", ts in "\\PC{0,30}") {
            let _ = verify(b"k", "id", &ts, &sigs, b"body", 0);
        }
    }
}
