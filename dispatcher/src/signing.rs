//! The registry's signing fields, shared by tools and webhooks: `signature` (the scheme) and
//! `rotate_secret` on a write, `signature` and `previous_secret_expires_at` on a read. The rules
//! themselves are `fleet_protocol::signature_scheme`'s; this module checks a request against them
//! and turns their errors into API errors.

use std::time::Duration;

use fleet_platform::now_ms;
use fleet_protocol::secrets::SecretsKey;
use fleet_protocol::signature_scheme::{check_secret, updated, SignatureScheme, Signing, SigningChange};
use fleet_protocol::timefmt::rfc3339_from_millis;

use crate::error::ApiError;

/// What a registration request says about signing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SigningRequest<'a> {
    pub scheme: Option<SignatureScheme>,
    pub rotate_secret: bool,
    pub new_secret: Option<&'a str>,
    /// The request's name for the secret (`callback_secret`, `secret`), for error messages.
    pub secret_field: &'static str,
}

/// The registration being updated: its signing state and its current secret's ciphertext.
pub(crate) struct Stored<'a> {
    pub signing: &'a Signing,
    pub secret_ciphertext: &'a str,
}

/// The signing state a write stores for `owner` (`tool:{name}`, `webhook:{id}`), or 422: a
/// rotation without a new secret or on a create, or a secret that cannot sign under the scheme
/// that will be in force (the stored secret is read back only when the scheme changes to
/// `standard-webhooks` without a new one).
pub(crate) fn next_signing(
    key: &SecretsKey,
    owner: &str,
    stored: Option<Stored<'_>>,
    request: SigningRequest<'_>,
    grace: Duration,
) -> Result<Signing, ApiError> {
    let change = SigningChange {
        scheme: request.scheme,
        rotate_secret: request.rotate_secret,
        new_secret: request.new_secret.is_some(),
    };
    let before = stored.as_ref().map(|s| (s.signing, s.secret_ciphertext));
    let next = updated(before, change, now_ms(), grace.as_millis() as i64)
        .map_err(|e| ApiError::invalid(format!("{e} ({})", request.secret_field)))?;
    let scheme_changes = stored.as_ref().is_none_or(|s| s.signing.scheme != next.scheme);
    let secret_to_check = match (request.new_secret, &stored) {
        (Some(secret), _) => Some(secret.to_string()),
        (None, Some(s)) if scheme_changes && next.scheme != SignatureScheme::Interactor => {
            Some(key.decrypt(owner, s.secret_ciphertext).map_err(|_| {
                ApiError::invalid(format!(
                    "the stored secret cannot be read to check it for {}; give {} too",
                    next.scheme.as_str(),
                    request.secret_field
                ))
            })?)
        }
        _ => None,
    };
    if let Some(secret) = secret_to_check {
        check_secret(next.scheme, &secret).map_err(|e| ApiError::invalid(format!("{}: {e}", request.secret_field)))?;
    }
    Ok(next)
}

/// `previous_secret_expires_at` for a read: when the rotated-out secret expires, while it lasts.
pub(crate) fn previous_secret_expires_at(signing: &Signing) -> Option<String> {
    signing.previous_in_force(now_ms()).map(|previous| rfc3339_from_millis(previous.expires_at_ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const GRACE: Duration = Duration::from_secs(60);

    fn request(scheme: Option<SignatureScheme>, rotate_secret: bool, new_secret: Option<&str>) -> SigningRequest<'_> {
        SigningRequest { scheme, rotate_secret, new_secret, secret_field: "callback_secret" }
    }

    #[test]
    fn a_standard_webhooks_secret_must_be_a_key_the_libraries_read() {
        let key = SecretsKey::parse(KEY_HEX).unwrap();
        let sw = Some(SignatureScheme::StandardWebhooks);
        let e = next_signing(&key, "tool:t", None, request(sw, false, Some("plain secret 1234")), GRACE).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.message.starts_with("callback_secret: a standard-webhooks secret must be base64"), "{}", e.message);
        let ok = next_signing(&key, "tool:t", None, request(sw, false, Some(STANDARD_SECRET)), GRACE).unwrap();
        assert_eq!(ok.scheme, SignatureScheme::StandardWebhooks);
        // The seed's scheme takes a plain secret.
        assert!(next_signing(&key, "tool:t", None, request(None, false, Some("plain secret 1234")), GRACE).is_ok());
    }

    #[test]
    fn switching_to_standard_webhooks_checks_the_stored_secret() {
        let key = SecretsKey::parse(KEY_HEX).unwrap();
        let signing = Signing::default();
        let plain = key.encrypt("tool:t", "plain secret 1234");
        let stored = Stored { signing: &signing, secret_ciphertext: &plain };
        let sw = Some(SignatureScheme::StandardWebhooks);
        let e = next_signing(&key, "tool:t", Some(stored), request(sw, false, None), GRACE).unwrap_err();
        assert!(e.message.contains("must be base64"), "{}", e.message);
        let good = key.encrypt("tool:t", STANDARD_SECRET);
        let stored = Stored { signing: &signing, secret_ciphertext: &good };
        assert!(next_signing(&key, "tool:t", Some(stored), request(sw, false, None), GRACE).is_ok());
    }

    #[test]
    fn rotation_errors_are_422_and_expiry_shows_while_in_force() {
        let key = SecretsKey::parse(KEY_HEX).unwrap();
        let e = next_signing(&key, "tool:t", None, request(None, true, Some("plain secret 1234")), GRACE).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        let signing = Signing::default();
        let stored = Stored { signing: &signing, secret_ciphertext: "v1.x" };
        let rotated =
            next_signing(&key, "tool:t", Some(stored), request(None, true, Some("new secret 123456")), GRACE).unwrap();
        assert!(previous_secret_expires_at(&rotated).is_some());
        assert_eq!(previous_secret_expires_at(&Signing::default()), None);
        let stored = Stored { signing: &signing, secret_ciphertext: "v1.x" };
        let e = next_signing(&key, "tool:t", Some(stored), request(None, true, None), GRACE).unwrap_err();
        assert!(e.message.contains("needs the new secret"), "{}", e.message);
    }
}
