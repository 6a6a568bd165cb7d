//! Signing one callback or webhook request under its registration's scheme
//! (`fleet_protocol::signature_scheme`): the seed's `X-Interactor-*` headers, or Standard Webhooks
//! with, during a rotation's grace period, the previous secret's signature beside the new one's.

use fleet_protocol::secrets::SecretsKey;
use fleet_protocol::signature_scheme::{signature_headers, SignatureScheme, Signing};

/// A registration's scheme and, while it still signs, its previous secret (decrypted). Its
/// `Debug` never shows the secret.
#[derive(Clone, Default)]
pub struct SigningKeys {
    scheme: SignatureScheme,
    /// The previous secret and when it stops signing (ms).
    previous: Option<(String, i64)>,
}

impl std::fmt::Debug for SigningKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKeys")
            .field("scheme", &self.scheme)
            .field("previous_until_ms", &self.previous.as_ref().map(|(_, until)| until))
            .finish()
    }
}

impl SigningKeys {
    /// The keys `signing` (of `owner`, `tool:{name}` or `webhook:{id}`) signs with from `now_ms`.
    /// A previous secret that does not decrypt is left out (the current one still signs).
    pub fn load(secrets: &SecretsKey, owner: &str, signing: &Signing, now_ms: i64) -> Self {
        let previous = signing.previous_signing(now_ms).and_then(|p| match secrets.decrypt(owner, &p.ciphertext) {
            Ok(secret) => Some((secret, p.expires_at_ms)),
            Err(e) => {
                tracing::warn!(owner, error = %e, "the previous secret cannot be used; signing with the current one only");
                None
            }
        });
        SigningKeys { scheme: signing.scheme, previous }
    }

    pub fn scheme(&self) -> SignatureScheme {
        self.scheme
    }

    /// The headers signing `body` of delivery `id` with `secret` at `now_ms` (the previous secret
    /// too until its grace period ends, even if these keys were loaded before that).
    pub fn headers(
        &self,
        id: &str,
        now_ms: i64,
        body: &[u8],
        secret: &str,
    ) -> Result<Vec<(&'static str, String)>, String> {
        let previous = self.previous.as_ref().filter(|(_, until)| *until > now_ms).map(|(s, _)| s.as_str());
        signature_headers(self.scheme, id, now_ms, body, secret, previous)
            .map_err(|e| format!("the secret cannot sign for {}: {e}", self.scheme.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_protocol::signature_scheme::PreviousSecret;
    use fleet_protocol::standard_webhooks::{key_from_secret, verify};

    const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const OLD: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const NEW: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

    fn rotating(key: &SecretsKey, scheme: SignatureScheme, expires_at_ms: i64) -> Signing {
        let ciphertext = key.encrypt("tool:t", OLD);
        Signing { scheme, previous: Some(PreviousSecret { ciphertext, expires_at_ms }) }
    }

    fn signatures(headers: &[(&'static str, String)]) -> usize {
        headers.iter().find(|(k, _)| *k == "webhook-signature").map_or(0, |(_, v)| v.split(' ').count())
    }

    #[test]
    fn the_previous_secret_signs_until_its_grace_period_ends() {
        let key = SecretsKey::parse(KEY_HEX).unwrap();
        let keys = SigningKeys::load(&key, "tool:t", &rotating(&key, SignatureScheme::StandardWebhooks, 10_000), 0);
        let during = keys.headers("exec_1", 9_999, b"{}", NEW).unwrap();
        assert_eq!(signatures(&during), 2);
        let old = key_from_secret(OLD).unwrap();
        let ts = &during[1].1;
        assert_eq!(verify(&old, "exec_1", ts, &during[2].1, b"{}", ts.parse().unwrap()), Ok(()));
        assert_eq!(signatures(&keys.headers("exec_1", 10_000, b"{}", NEW).unwrap()), 1);
        assert!(!format!("{keys:?}").contains("whsec"), "{keys:?}");
    }

    #[test]
    fn the_seed_scheme_and_unreadable_previous_secrets_sign_with_the_current_one() {
        let key = SecretsKey::parse(KEY_HEX).unwrap();
        let seed = SigningKeys::load(&key, "tool:t", &rotating(&key, SignatureScheme::Interactor, 10_000), 0);
        let headers = seed.headers("exec_1", 0, b"{}", "plain secret").unwrap();
        assert_eq!(headers[0].0, "X-Interactor-Signature");
        let wrong_owner =
            SigningKeys::load(&key, "tool:u", &rotating(&key, SignatureScheme::StandardWebhooks, 10_000), 0);
        assert_eq!(signatures(&wrong_owner.headers("exec_1", 0, b"{}", NEW).unwrap()), 1);
        let e = wrong_owner.headers("exec_1", 0, b"{}", "plain secret").unwrap_err();
        assert!(e.starts_with("the secret cannot sign for standard-webhooks"), "{e}");
    }
}
