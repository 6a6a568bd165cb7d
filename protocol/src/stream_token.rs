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

/// A token for the stream of the session stored as `stored_id` that expires at `expires_at_ms`.
/// A tenant's session (`tenant::session_storage_id`) names its tenant after the signature, so the
/// stream's path, which holds the key as the client sent it, finds the session again.
pub fn sign(key: &[u8; 32], stored_id: &str, expires_at_ms: i64) -> String {
    let tag = hex::encode(mac(key, stored_id, expires_at_ms).finalize().into_bytes());
    match stored_id.split_once(crate::tenant::SESSION_SCOPE_SEPARATOR) {
        Some((tenant, _)) => format!("{PREFIX}.{expires_at_ms}.{tag}.{tenant}"),
        None => format!("{PREFIX}.{expires_at_ms}.{tag}"),
    }
}

/// Accepts `token` for the stream of the session its client calls `session_key` at `now_ms`, or
/// says why not; on success, the tenant whose session it is, if a tenant's. The signature is
/// compared in constant time.
pub fn verify(key: &[u8; 32], token: &str, session_key: &str, now_ms: i64) -> Result<Option<String>, TokenError> {
    let mut parts = token.splitn(4, '.');
    let (Some(PREFIX), Some(expiry), Some(tag)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(TokenError::Malformed);
    };
    let tenant = parts.next().map(str::to_string);
    if tenant.as_deref().is_some_and(|t| !crate::tenant::is_tenant_name(t)) {
        return Err(TokenError::Malformed);
    }
    let expires_at_ms: i64 = expiry.parse().map_err(|_| TokenError::Malformed)?;
    // One spelling per token, as `sign` writes it: no leading zeros or sign, lower-case hex.
    let canonical =
        expiry == expires_at_ms.to_string() && tag.len() == 64 && !tag.bytes().any(|b| b.is_ascii_uppercase());
    let tag = hex::decode(tag).ok().filter(|_| canonical).ok_or(TokenError::Malformed)?;
    let stored = crate::tenant::session_storage_id(tenant.as_deref(), session_key);
    mac(key, &stored, expires_at_ms).verify_slice(&tag).map_err(|_| TokenError::WrongSignature)?;
    if now_ms >= expires_at_ms {
        return Err(TokenError::Expired);
    }
    Ok(tenant)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [9; 32];

    #[test]
    fn a_tenants_token_opens_its_own_session_of_that_key_only() {
        let stored = crate::tenant::session_storage_id(Some("acme"), "user_42");
        let token = sign(&KEY, &stored, 1_000_060_000);
        assert_eq!(verify(&KEY, &token, "user_42", 0), Ok(Some("acme".to_string())));
        let beta = token.replacen(".acme", ".beta", 1);
        assert_eq!(verify(&KEY, &beta, "user_42", 0), Err(TokenError::WrongSignature), "another tenant's session");
        let unscoped = token.rsplit_once('.').unwrap().0.to_string();
        assert_eq!(verify(&KEY, &unscoped, "user_42", 0), Err(TokenError::WrongSignature), "the unbound session");
        let dotted = sign(&KEY, &crate::tenant::session_storage_id(Some("a.b"), "k"), 1_000_060_000);
        assert_eq!(verify(&KEY, &dotted, "k", 0), Ok(Some("a.b".to_string())));
    }

    #[test]
    fn a_token_has_one_spelling() {
        let token = sign(&KEY, "s1", 1_000_060_000);
        let (head, tag) = token.rsplit_once('.').unwrap();
        assert_eq!(verify(&KEY, &format!("{head}.{}", tag.to_uppercase()), "s1", 0), Err(TokenError::Malformed));
        let padded = token.replacen(".1000060000.", ".01000060000.", 1);
        assert_eq!(verify(&KEY, &padded, "s1", 0), Err(TokenError::Malformed));
        let signed = token.replacen(".1000060000.", ".+1000060000.", 1);
        assert_eq!(verify(&KEY, &signed, "s1", 0), Err(TokenError::Malformed));
        assert_eq!(verify(&KEY, &token, "s1", 0), Ok(None));
    }

    #[test]
    fn a_token_admits_its_session_until_it_expires() {
        let token = sign(&KEY, "s1", 1_000_060_000);
        assert_eq!(verify(&KEY, &token, "s1", 1_000_000_000), Ok(None));
        assert_eq!(verify(&KEY, &token, "s1", 1_000_059_999), Ok(None));
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
        for bad in [
            "",
            "st1",
            "st1.x.00",
            "st2.2000.00",
            "st1.2000.zz",
            "st1.2000.00.00",
            "st1.2000.00.no/tenant",
            "test-token-0123456789",
        ] {
            assert_eq!(verify(&KEY, bad, "s1", 1_000), Err(TokenError::Malformed), "{bad:?}");
        }
    }
}
