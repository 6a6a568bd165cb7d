//! Stream tokens: short-lived credentials, each good for one session's SSE stream only, that a
//! browser's `EventSource` (which cannot send an `Authorization` header) puts in the query string.
//!
//! A token is `st1.<expiry, Unix ms>.<HMAC-SHA256, hex>` over the session id and the expiry, keyed
//! with a subkey of `FLEET_SECRETS_KEY`: every dispatcher replica verifies what any other signed,
//! with nothing stored.

use hmac::{Hmac, Mac};
use sha2::Sha256;

const PREFIX: &str = "st1";

/// How long a token admits new connections (a stream already open outlives it).
pub const TOKEN_TTL_MS: i64 = 60_000;

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the stream token is malformed")]
    Malformed,
    #[error("the stream token has expired")]
    Expired,
    #[error("the stream token is not valid for this session")]
    WrongSignature,
}

fn mac(key: &[u8; 32], session_id: &str, expires_at_ms: i64) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(b"fleet stream token v1\n");
    mac.update(session_id.as_bytes());
    mac.update(b"\n");
    mac.update(expires_at_ms.to_string().as_bytes());
    mac
}

/// A token for `session_id`'s stream that expires at `expires_at_ms`.
pub fn sign(key: &[u8; 32], session_id: &str, expires_at_ms: i64) -> String {
    let tag = mac(key, session_id, expires_at_ms).finalize().into_bytes();
    format!("{PREFIX}.{expires_at_ms}.{}", hex::encode(tag))
}

/// Accepts `token` for `session_id`'s stream at `now_ms`, or says why not. The signature is
/// compared in constant time.
pub fn verify(key: &[u8; 32], token: &str, session_id: &str, now_ms: i64) -> Result<(), TokenError> {
    let mut parts = token.split('.');
    let (Some(PREFIX), Some(expiry), Some(tag), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(TokenError::Malformed);
    };
    let expires_at_ms: i64 = expiry.parse().map_err(|_| TokenError::Malformed)?;
    // One spelling per token, as `sign` writes it: no leading zeros or sign, lower-case hex.
    let canonical = expiry == expires_at_ms.to_string() && !tag.bytes().any(|b| b.is_ascii_uppercase());
    let tag = hex::decode(tag).ok().filter(|_| canonical).ok_or(TokenError::Malformed)?;
    mac(key, session_id, expires_at_ms).verify_slice(&tag).map_err(|_| TokenError::WrongSignature)?;
    if now_ms >= expires_at_ms {
        return Err(TokenError::Expired);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [9; 32];

    #[test]
    fn a_token_has_one_spelling() {
        let token = sign(&KEY, "s1", 1_000_060_000);
        let (head, tag) = token.rsplit_once('.').unwrap();
        assert_eq!(verify(&KEY, &format!("{head}.{}", tag.to_uppercase()), "s1", 0), Err(TokenError::Malformed));
        let padded = token.replacen(".1000060000.", ".01000060000.", 1);
        assert_eq!(verify(&KEY, &padded, "s1", 0), Err(TokenError::Malformed));
        let signed = token.replacen(".1000060000.", ".+1000060000.", 1);
        assert_eq!(verify(&KEY, &signed, "s1", 0), Err(TokenError::Malformed));
        assert_eq!(verify(&KEY, &token, "s1", 0), Ok(()));
    }

    #[test]
    fn a_token_admits_its_session_until_it_expires() {
        let token = sign(&KEY, "s1", 1_000_060_000);
        assert_eq!(verify(&KEY, &token, "s1", 1_000_000_000), Ok(()));
        assert_eq!(verify(&KEY, &token, "s1", 1_000_059_999), Ok(()));
        assert_eq!(verify(&KEY, &token, "s1", 1_000_060_000), Err(TokenError::Expired));
    }

    #[test]
    fn a_token_admits_no_other_session_key_or_expiry() {
        let token = sign(&KEY, "s1", 2_000);
        assert_eq!(verify(&KEY, &token, "s2", 1_000), Err(TokenError::WrongSignature));
        assert_eq!(verify(&KEY, &token, "s1\n", 1_000), Err(TokenError::WrongSignature));
        assert_eq!(verify(&[8; 32], &token, "s1", 1_000), Err(TokenError::WrongSignature));
        let stretched = token.replacen("2000", "9000", 1);
        assert_eq!(verify(&KEY, &stretched, "s1", 1_000), Err(TokenError::WrongSignature));
    }

    #[test]
    fn garbage_is_malformed() {
        for bad in ["", "st1", "st1.x.00", "st2.2000.00", "st1.2000.zz", "st1.2000.00.00", "test-token-0123456789"] {
            assert_eq!(verify(&KEY, bad, "s1", 1_000), Err(TokenError::Malformed), "{bad:?}");
        }
    }
}
