//! Per-tool and per-webhook signature schemes and secret rotation: which scheme a registration
//! signs with, what a `PUT` (with or without `rotate_secret`) makes of its signing state, and the
//! headers one signed request carries.
//!
//! - `interactor` (the seed's, the default): `X-Interactor-Signature: sha256=<hex>` over the body
//!   with the secret's bytes as the key, `X-Interactor-Timestamp` (ISO 8601),
//!   `X-Interactor-Request-Id`. A rotation switches to the new secret at once; the previous one
//!   is kept, encrypted, only until the grace period ends, and never signs.
//! - `standard-webhooks`: `webhook-id` (the execution id: the same on every retry of a delivery,
//!   the receiver's dedup key), `webhook-timestamp` (Unix seconds), `webhook-signature`. During a
//!   rotation's grace period the request carries two signatures, the new secret's first, so a
//!   receiver holding either secret verifies.

use serde::{Deserialize, Serialize};

use crate::callback::{REQUEST_ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use crate::standard_webhooks::{self, KeyError};
use crate::timefmt::rfc3339_from_millis;

/// How a registration's requests are signed. `interactor`: `X-Interactor-Signature: sha256=<hex>`
/// over the body. `standard-webhooks`: `webhook-id`, `webhook-timestamp`,
/// `webhook-signature: v1,<base64>` (Standard Webhooks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum SignatureScheme {
    /// The seed's `X-Interactor-Signature`.
    #[default]
    Interactor,
    /// `webhook-id`, `webhook-timestamp`, `webhook-signature`, per the Standard Webhooks spec.
    StandardWebhooks,
}

impl SignatureScheme {
    pub fn as_str(self) -> &'static str {
        match self {
            SignatureScheme::Interactor => "interactor",
            SignatureScheme::StandardWebhooks => "standard-webhooks",
        }
    }
}

/// The secret a rotation replaced, kept (as ciphertext, under the same owner as the current one)
/// until `expires_at_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousSecret {
    pub ciphertext: String,
    pub expires_at_ms: i64,
}

/// A tool's or webhook's signing state as stored beside its (encrypted) secret.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signing {
    #[serde(default)]
    pub scheme: SignatureScheme,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<PreviousSecret>,
}

impl Signing {
    /// Nothing to store: the seed's scheme and no rotation (stored records stay as they were).
    pub fn is_default(&self) -> bool {
        *self == Signing::default()
    }

    /// The previous secret while its grace period lasts.
    pub fn previous_in_force(&self, now_ms: i64) -> Option<&PreviousSecret> {
        self.previous.as_ref().filter(|p| p.expires_at_ms > now_ms)
    }

    /// The previous secret if requests must still be signed with it too (Standard Webhooks only).
    pub fn previous_signing(&self, now_ms: i64) -> Option<&PreviousSecret> {
        self.previous_in_force(now_ms).filter(|_| self.scheme == SignatureScheme::StandardWebhooks)
    }
}

/// What a registration request asks of the signing state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SigningChange {
    pub scheme: Option<SignatureScheme>,
    pub rotate_secret: bool,
    /// Whether the request gives a new secret.
    pub new_secret: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RotationError {
    #[error("rotate_secret needs the new secret in the same request")]
    NoNewSecret,
    #[error("rotate_secret applies to an existing registration; this request creates one")]
    NothingToRotate,
}

/// The signing state after `change`, given the stored state and current secret's ciphertext
/// (`None` when the request creates the registration). A rotation keeps the replaced secret for
/// `grace_ms`; a new secret without `rotate_secret` replaces it outright (no overlap, the seed's
/// behaviour) and ends any rotation; anything else keeps a rotation still in force. A second
/// rotation within the grace period keeps only the secret it replaces.
pub fn updated(
    stored: Option<(&Signing, &str)>,
    change: SigningChange,
    now_ms: i64,
    grace_ms: i64,
) -> Result<Signing, RotationError> {
    if change.rotate_secret && !change.new_secret {
        return Err(RotationError::NoNewSecret);
    }
    let scheme = change.scheme.or(stored.map(|(s, _)| s.scheme)).unwrap_or_default();
    let previous = match stored {
        None if change.rotate_secret => return Err(RotationError::NothingToRotate),
        None => None,
        Some((_, current)) if change.rotate_secret => {
            Some(PreviousSecret { ciphertext: current.to_string(), expires_at_ms: now_ms + grace_ms })
        }
        Some(_) if change.new_secret => None,
        Some((signing, _)) => signing.previous_in_force(now_ms).cloned(),
    };
    Ok(Signing { scheme, previous })
}

/// The headers that sign one request of `body` for delivery `id` at `now_ms`: with `secret`, and
/// also with `previous` (Standard Webhooks only; the caller passes it only while it signs). A
/// previous secret that is no Standard Webhooks key (registered plain, under the seed's scheme)
/// cannot sign and is left out; a current one that is no key is an error.
pub fn signature_headers(
    scheme: SignatureScheme,
    id: &str,
    now_ms: i64,
    body: &[u8],
    secret: &str,
    previous: Option<&str>,
) -> Result<Vec<(&'static str, String)>, KeyError> {
    Ok(match scheme {
        SignatureScheme::Interactor => vec![
            (SIGNATURE_HEADER, crate::signing::signature_header(secret.as_bytes(), body)),
            (TIMESTAMP_HEADER, rfc3339_from_millis(now_ms)),
            (REQUEST_ID_HEADER, id.to_string()),
        ],
        SignatureScheme::StandardWebhooks => {
            let mut keys = vec![standard_webhooks::key_from_secret(secret)?];
            keys.extend(previous.and_then(|p| standard_webhooks::key_from_secret(p).ok()));
            let timestamp = now_ms.div_euclid(1000);
            vec![
                (standard_webhooks::ID_HEADER, id.to_string()),
                (standard_webhooks::TIMESTAMP_HEADER, timestamp.to_string()),
                (standard_webhooks::SIGNATURE_HEADER, standard_webhooks::signature_header(&keys, id, timestamp, body)),
            ]
        }
    })
}

/// Whether `secret` may be registered for `scheme` (the seed's takes any 16-1024 bytes, checked
/// apart; Standard Webhooks needs a key its libraries can read).
pub fn check_secret(scheme: SignatureScheme, secret: &str) -> Result<(), KeyError> {
    match scheme {
        SignatureScheme::Interactor => Ok(()),
        SignatureScheme::StandardWebhooks => standard_webhooks::check_new_secret(secret),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: i64 = 86_400_000;
    const OLD: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const NEW: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

    fn change(scheme: Option<SignatureScheme>, rotate_secret: bool, new_secret: bool) -> SigningChange {
        SigningChange { scheme, rotate_secret, new_secret }
    }

    fn rotating(expires_at_ms: i64) -> Signing {
        Signing {
            scheme: SignatureScheme::StandardWebhooks,
            previous: Some(PreviousSecret { ciphertext: "v1.older".into(), expires_at_ms }),
        }
    }

    #[test]
    fn the_scheme_parses_from_its_api_names_and_defaults_to_the_seeds() {
        let scheme: SignatureScheme = serde_json::from_str(r#""standard-webhooks""#).unwrap();
        assert_eq!(scheme, SignatureScheme::StandardWebhooks);
        assert_eq!(serde_json::to_string(&SignatureScheme::Interactor).unwrap(), r#""interactor""#);
        assert!(serde_json::from_str::<SignatureScheme>(r#""hmac""#).is_err());
        let stored: Signing = serde_json::from_str("{}").unwrap();
        assert!(stored.is_default());
        assert_eq!(serde_json::to_string(&Signing::default()).unwrap(), r#"{"scheme":"interactor"}"#);
    }

    #[test]
    fn a_rotation_keeps_the_replaced_secret_for_the_grace_period() {
        let stored = Signing::default();
        let next = updated(Some((&stored, "v1.current")), change(None, true, true), 1_000, GRACE).unwrap();
        let kept = PreviousSecret { ciphertext: "v1.current".into(), expires_at_ms: 1_000 + GRACE };
        assert_eq!(next, Signing { scheme: SignatureScheme::Interactor, previous: Some(kept.clone()) });
        assert_eq!(next.previous_in_force(1_000 + GRACE - 1), Some(&kept));
        assert_eq!(next.previous_in_force(1_000 + GRACE), None);
        // Under the seed's scheme the previous secret never signs; under Standard Webhooks it does.
        assert_eq!(next.previous_signing(2_000), None);
        let sw = Signing { scheme: SignatureScheme::StandardWebhooks, ..next };
        assert_eq!(sw.previous_signing(2_000), Some(&kept));
        assert_eq!(sw.previous_signing(1_000 + GRACE), None);
    }

    #[test]
    fn what_other_updates_do_to_a_rotation() {
        let stored = rotating(50_000);
        let at = |now, c| updated(Some((&stored, "v1.current")), c, now, GRACE).unwrap();
        // Another field changed: the rotation goes on while in force, and is dropped once over.
        assert_eq!(at(10_000, change(None, false, false)), stored);
        assert_eq!(at(50_000, change(None, false, false)).previous, None);
        // A plain new secret replaces outright and ends the rotation.
        assert_eq!(at(10_000, change(None, false, true)).previous, None);
        // A second rotation keeps only the secret it replaces.
        let again = at(10_000, change(None, true, true)).previous.unwrap();
        assert_eq!((again.ciphertext.as_str(), again.expires_at_ms), ("v1.current", 10_000 + GRACE));
        // The scheme changes only when asked.
        assert_eq!(
            at(10_000, change(Some(SignatureScheme::Interactor), false, false)).scheme,
            SignatureScheme::Interactor
        );
        assert_eq!(at(10_000, change(None, false, true)).scheme, SignatureScheme::StandardWebhooks);
    }

    #[test]
    fn a_rotation_needs_a_new_secret_and_something_to_rotate() {
        let stored = Signing::default();
        assert_eq!(
            updated(Some((&stored, "v1.c")), change(None, true, false), 0, GRACE),
            Err(RotationError::NoNewSecret)
        );
        assert_eq!(updated(None, change(None, true, true), 0, GRACE), Err(RotationError::NothingToRotate));
        let created = updated(None, change(Some(SignatureScheme::StandardWebhooks), false, true), 0, GRACE).unwrap();
        assert_eq!(created, Signing { scheme: SignatureScheme::StandardWebhooks, previous: None });
        assert_eq!(updated(None, change(None, false, true), 0, GRACE).unwrap(), Signing::default());
    }

    #[test]
    fn seed_headers_are_the_seeds() {
        let headers =
            signature_headers(SignatureScheme::Interactor, "exec_1", 1_768_910_400_000, b"{}", "s3cret", None).unwrap();
        assert_eq!(
            headers,
            [
                (SIGNATURE_HEADER, crate::signing::signature_header(b"s3cret", b"{}")),
                (TIMESTAMP_HEADER, "2026-01-20T12:00:00.000Z".to_string()),
                (REQUEST_ID_HEADER, "exec_1".to_string()),
            ]
        );
        // A plain secret is fine for the seed's scheme, and a previous one is never used.
        let with_previous =
            signature_headers(SignatureScheme::Interactor, "exec_1", 1_768_910_400_000, b"{}", "s3cret", Some(OLD))
                .unwrap();
        assert_eq!(with_previous, headers);
    }

    #[test]
    fn standard_headers_sign_with_each_secret_in_force() {
        let (now_ms, body) = (1_649_367_553_999, br#"{"a":1}"#);
        let get =
            |previous| signature_headers(SignatureScheme::StandardWebhooks, "exec_9", now_ms, body, NEW, previous);
        let single = get(None).unwrap();
        assert_eq!(single[0], ("webhook-id", "exec_9".to_string()));
        assert_eq!(single[1], ("webhook-timestamp", "1649367553".to_string()));
        let both = get(Some(OLD)).unwrap();
        let sigs: Vec<&str> = both[2].1.split(' ').collect();
        assert_eq!(sigs.len(), 2);
        assert_eq!(sigs[0], single[2].1);
        for secret in [NEW, OLD] {
            let key = standard_webhooks::key_from_secret(secret).unwrap();
            assert_eq!(
                standard_webhooks::verify(&key, "exec_9", "1649367553", &both[2].1, body, 1_649_367_560),
                Ok(())
            );
        }
        // A previous secret registered plain cannot sign and is left out; a plain current one is an error.
        assert_eq!(get(Some("a plain seed secret")).unwrap(), single);
        let plain = signature_headers(SignatureScheme::StandardWebhooks, "e", now_ms, body, "a plain one!", None);
        assert_eq!(plain, Err(KeyError::NotBase64));
    }

    #[test]
    fn secrets_are_checked_for_the_scheme_they_sign_with() {
        assert_eq!(check_secret(SignatureScheme::Interactor, "any plain secret"), Ok(()));
        assert_eq!(check_secret(SignatureScheme::StandardWebhooks, NEW), Ok(()));
        assert_eq!(check_secret(SignatureScheme::StandardWebhooks, "any plain secret"), Err(KeyError::NotBase64));
    }
}
