//! Encryption of stored secrets (tool callback secrets, webhook secrets) with `FLEET_SECRETS_KEY`.
//!
//! AES-256-GCM with a random nonce; the owner's name is the associated data, so a ciphertext copied
//! onto another tool does not decrypt.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

const FORMAT_PREFIX: &str = "v1.";
const NONCE_LEN: usize = 12;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretsError {
    #[error("must be 32 bytes, as 64 hex digits or base64")]
    BadKey,
    #[error("stored secret is corrupt or was encrypted with another key")]
    Undecryptable,
}

/// The key that encrypts secrets at rest. Its `Debug` never shows the key.
#[derive(Clone)]
pub struct SecretsKey {
    cipher: Aes256Gcm,
    /// HMAC keyed with the secrets key, from which purpose-bound subkeys derive (the key itself is
    /// not kept apart from the cipher).
    derivation: Hmac<Sha256>,
}

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretsKey(<redacted>)")
    }
}

impl SecretsKey {
    /// Parses 32 bytes given as 64 hex digits or as base64.
    pub fn parse(text: &str) -> Result<Self, SecretsError> {
        let text = text.trim();
        let bytes = if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            hex::decode(text).map_err(|_| SecretsError::BadKey)?
        } else {
            STANDARD.decode(text).map_err(|_| SecretsError::BadKey)?
        };
        if bytes.len() != 32 {
            return Err(SecretsError::BadKey);
        }
        Ok(SecretsKey {
            cipher: Aes256Gcm::new_from_slice(&bytes).map_err(|_| SecretsError::BadKey)?,
            derivation: <Hmac<Sha256> as Mac>::new_from_slice(&bytes).map_err(|_| SecretsError::BadKey)?,
        })
    }

    /// A 32-byte key for one `purpose` (HMAC-SHA256 of the purpose under the secrets key): every
    /// process holding the same `FLEET_SECRETS_KEY` derives the same subkey, and a subkey reveals
    /// neither the secrets key nor another purpose's subkey.
    pub fn subkey(&self, purpose: &str) -> [u8; 32] {
        let mut mac = self.derivation.clone();
        mac.update(b"fleet subkey\n");
        mac.update(purpose.as_bytes());
        mac.finalize().into_bytes().into()
    }

    pub fn encrypt(&self, owner: &str, plaintext: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let sealed = self
            .cipher
            .encrypt(Nonce::from_slice(&nonce), Payload { msg: plaintext.as_bytes(), aad: owner.as_bytes() })
            .expect("AES-GCM encryption of a small secret cannot fail");
        let mut out = nonce.to_vec();
        out.extend(sealed);
        format!("{FORMAT_PREFIX}{}", STANDARD.encode(out))
    }

    pub fn decrypt(&self, owner: &str, stored: &str) -> Result<String, SecretsError> {
        let raw = stored
            .strip_prefix(FORMAT_PREFIX)
            .and_then(|b| STANDARD.decode(b).ok())
            .filter(|raw| raw.len() > NONCE_LEN)
            .ok_or(SecretsError::Undecryptable)?;
        let (nonce, sealed) = raw.split_at(NONCE_LEN);
        let plain = self
            .cipher
            .decrypt(Nonce::from_slice(nonce), Payload { msg: sealed, aad: owner.as_bytes() })
            .map_err(|_| SecretsError::Undecryptable)?;
        String::from_utf8(plain).map_err(|_| SecretsError::Undecryptable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn round_trips_and_hides_the_plaintext() {
        let key = SecretsKey::parse(KEY_HEX).unwrap();
        let stored = key.encrypt("tool:search", "whsec_123");
        assert!(!stored.contains("whsec_123"));
        assert_ne!(stored, key.encrypt("tool:search", "whsec_123"), "nonces are fresh");
        assert_eq!(key.decrypt("tool:search", &stored).unwrap(), "whsec_123");
    }

    #[test]
    fn refuses_another_owner_or_key() {
        let key = SecretsKey::parse(KEY_HEX).unwrap();
        let stored = key.encrypt("tool:a", "s");
        assert_eq!(key.decrypt("tool:b", &stored), Err(SecretsError::Undecryptable));
        let other = SecretsKey::parse(&STANDARD.encode([7u8; 32])).unwrap();
        assert_eq!(other.decrypt("tool:a", &stored), Err(SecretsError::Undecryptable));
        assert_eq!(key.decrypt("tool:a", "garbage"), Err(SecretsError::Undecryptable));
    }

    #[test]
    fn subkeys_are_stable_per_purpose_and_key() {
        let key = SecretsKey::parse(KEY_HEX).unwrap();
        assert_eq!(key.subkey("stream-token"), SecretsKey::parse(KEY_HEX).unwrap().subkey("stream-token"));
        assert_ne!(key.subkey("stream-token"), key.subkey("other"));
        let other = SecretsKey::parse(&STANDARD.encode([7u8; 32])).unwrap();
        assert_ne!(key.subkey("stream-token"), other.subkey("stream-token"));
    }

    #[test]
    fn keys_must_be_32_bytes() {
        assert!(SecretsKey::parse("short").is_err());
        assert!(SecretsKey::parse(&STANDARD.encode([1u8; 16])).is_err());
        assert!(format!("{:?}", SecretsKey::parse(KEY_HEX).unwrap()).contains("redacted"));
    }
}
