//! Client-side TLS for every connection a fleet process opens (Redis, RabbitMQ, callbacks, the
//! model): one set of trusted roots (the bundled Mozilla roots, a private CA bundle from
//! `FLEET_TLS_CA_FILE`, and the system's store with `FLEET_TLS_NATIVE_ROOTS=true`) and an optional
//! client certificate, presented only to Redis and RabbitMQ. Files are read and checked once, at
//! start; a bad one is a configuration error naming its setting.

use std::sync::Arc;

use base64::Engine;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::config::{ConfigError, Source};

pub const CA_FILE: &str = "FLEET_TLS_CA_FILE";
pub const NATIVE_ROOTS: &str = "FLEET_TLS_NATIVE_ROOTS";
pub const CLIENT_CERT_FILE: &str = "FLEET_TLS_CLIENT_CERT_FILE";
pub const CLIENT_KEY_FILE: &str = "FLEET_TLS_CLIENT_KEY_FILE";

/// A client certificate chain and its key (PEM as read, DER as parsed).
struct Identity {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

struct Material {
    /// Every trusted root, in DER.
    roots: Vec<CertificateDer<'static>>,
    /// How many of them came from `FLEET_TLS_CA_FILE` and from the system's store.
    private_roots: usize,
    native_roots: usize,
    identity: Option<Identity>,
}

/// The process's TLS client settings, parsed. Cheap to clone.
#[derive(Clone)]
pub struct ClientTls {
    material: Arc<Material>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is never printed; only what is trusted and whether a client certificate is set.
        f.debug_struct("ClientTls")
            .field("roots", &self.material.roots.len())
            .field("private_roots", &self.material.private_roots)
            .field("native_roots", &self.material.native_roots)
            .field("client_certificate", &self.material.identity.is_some())
            .finish()
    }
}

impl Default for ClientTls {
    /// The bundled roots only, no client certificate.
    fn default() -> Self {
        ClientTls::build(Vec::new(), Vec::new(), None)
    }
}

impl ClientTls {
    /// Reads `FLEET_TLS_CA_FILE`, `FLEET_TLS_NATIVE_ROOTS`, `FLEET_TLS_CLIENT_CERT_FILE` and
    /// `FLEET_TLS_CLIENT_KEY_FILE`.
    pub fn load(src: &Source) -> Result<Self, ConfigError> {
        let private = match src.get(CA_FILE) {
            None => Vec::new(),
            Some(path) => parse_ca_bundle(&read(CA_FILE, path)?).map_err(|p| ConfigError::new(CA_FILE, p))?,
        };
        let native = if src.flag(NATIVE_ROOTS, false)? { native_roots()? } else { Vec::new() };
        let identity = match (src.get(CLIENT_CERT_FILE), src.get(CLIENT_KEY_FILE)) {
            (None, None) => None,
            (Some(_), None) => return Err(ConfigError::new(CLIENT_KEY_FILE, "is required with FLEET_TLS_CLIENT_CERT_FILE")),
            (None, Some(_)) => return Err(ConfigError::new(CLIENT_CERT_FILE, "is required with FLEET_TLS_CLIENT_KEY_FILE")),
            (Some(cert), Some(key)) => Some(parse_identity(read(CLIENT_CERT_FILE, cert)?, read(CLIENT_KEY_FILE, key)?)?),
        };
        Ok(ClientTls::build(private, native, identity))
    }

    fn build(
        private: Vec<CertificateDer<'static>>,
        native: Vec<CertificateDer<'static>>,
        identity: Option<Identity>,
    ) -> Self {
        install_crypto_provider();
        let (private_roots, native_roots) = (private.len(), native.len());
        let mut roots: Vec<CertificateDer<'static>> = webpki_root_certs::TLS_SERVER_ROOT_CERTS.to_vec();
        roots.extend(private);
        roots.extend(native);
        ClientTls { material: Arc::new(Material { roots, private_roots, native_roots, identity }) }
    }

    fn root_store(&self) -> RootCertStore {
        let mut store = RootCertStore::empty();
        // The bundled and system stores hold a few certificates webpki cannot use; skip those.
        // The private bundle was checked at load time.
        store.add_parsable_certificates(self.material.roots.iter().cloned());
        store
    }

    fn builder(&self) -> rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert> {
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("the default provider supports the default protocol versions")
            .with_root_certificates(self.root_store())
    }

    /// For HTTPS (callbacks, the model): the trusted roots, never the client certificate, which
    /// is meant for the fleet's own services and not for every tool owner that asks for one.
    pub fn http_config(&self) -> ClientConfig {
        self.builder().with_no_client_auth()
    }

    /// For the fleet's services (RabbitMQ): the trusted roots and the client certificate, if set.
    pub fn service_config(&self) -> ClientConfig {
        match &self.material.identity {
            Some(id) => self
                .builder()
                .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
                .expect("the client key was checked against its certificate at load time"),
            None => self.builder().with_no_client_auth(),
        }
    }

    /// For Redis (`rediss://`), which takes PEM: the trusted roots and the client certificate.
    pub fn redis_certificates(&self) -> redis::TlsCertificates {
        let root_pem: String = self.material.roots.iter().map(|der| to_pem(der)).collect();
        redis::TlsCertificates {
            client_tls: self.material.identity.as_ref().map(|id| redis::ClientTlsConfig {
                client_cert: id.cert_pem.clone(),
                client_key: id.key_pem.clone(),
            }),
            root_cert: Some(root_pem.into_bytes()),
        }
    }
}

/// rustls needs one process-wide provider when more than one is compiled in (the redis crate
/// builds its configurations with the process default); a second call changes nothing.
fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

fn read(setting: &str, path: &str) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| ConfigError::new(setting, format!("cannot read {path}: {e}")))
}

/// Every certificate of a PEM bundle; a bundle without one, or with one rustls cannot use as a
/// root, is refused (silently trusting less than the operator listed would fail much later).
fn parse_ca_bundle(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("is not a PEM certificate bundle: {e}"))?;
    if certs.is_empty() {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
    }
    let mut store = RootCertStore::empty();
    let (_, unusable) = store.add_parsable_certificates(certs.iter().cloned());
    if unusable > 0 {
        return Err(format!("{unusable} of its {} certificates cannot be used as a trusted root", certs.len()));
    }
    Ok(certs)
}

fn parse_identity(cert_pem: Vec<u8>, key_pem: Vec<u8>) -> Result<Identity, ConfigError> {
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError::new(CLIENT_CERT_FILE, format!("is not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(ConfigError::new(CLIENT_CERT_FILE, "holds no PEM certificate"));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| ConfigError::new(CLIENT_KEY_FILE, format!("holds no usable PEM private key: {e}")))?;
    // Building a configuration checks that the key is one rustls can sign with.
    ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("the default provider supports the default protocol versions")
        .with_root_certificates(RootCertStore::empty())
        .with_client_auth_cert(chain.clone(), key.clone_key())
        .map_err(|e| ConfigError::new(CLIENT_KEY_FILE, format!("does not fit the client certificate: {e}")))?;
    Ok(Identity { cert_pem, key_pem, chain, key })
}

/// The system's trusted roots (`SSL_CERT_FILE` / `SSL_CERT_DIR` honoured); none at all is an error.
fn native_roots() -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let found = rustls_native_certs::load_native_certs();
    if found.certs.is_empty() {
        let why = found.errors.first().map(|e| format!(": {e}")).unwrap_or_default();
        return Err(ConfigError::new(NATIVE_ROOTS, format!("no system root certificates were found{why}")));
    }
    Ok(found.certs)
}

fn to_pem(der: &CertificateDer<'_>) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut pem = String::with_capacity(b64.len() + b64.len() / 64 + 64);
    pem.push_str("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(pairs: &[(&str, &str)]) -> Result<ClientTls, ConfigError> {
        ClientTls::load(&Source::from_pairs(pairs.iter().copied()))
    }

    fn temp_file(name: &str, contents: &[u8]) -> String {
        let dir = std::env::temp_dir().join(format!("fleet-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path.to_string_lossy().into_owned()
    }

    #[test]
    fn defaults_trust_the_bundled_roots_only() {
        let tls = load(&[]).unwrap();
        assert_eq!(tls.material.roots.len(), webpki_root_certs::TLS_SERVER_ROOT_CERTS.len());
        assert!(tls.material.identity.is_none());
        assert!(!tls.root_store().is_empty());
        let _ = tls.http_config();
        let _ = tls.service_config();
    }

    #[test]
    fn bad_files_name_their_setting() {
        let setting = |pairs: &[(&str, &str)]| load(pairs).unwrap_err().setting;
        assert_eq!(setting(&[(CA_FILE, "/nonexistent/ca.pem")]), CA_FILE);
        let not_pem = temp_file("not-pem", b"hello, I am not a certificate\n");
        assert_eq!(setting(&[(CA_FILE, &not_pem)]), CA_FILE);
        let garbage = temp_file("garbage", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
        assert_eq!(setting(&[(CA_FILE, &garbage)]), CA_FILE);
        assert_eq!(setting(&[(CLIENT_CERT_FILE, &not_pem)]), CLIENT_KEY_FILE);
        assert_eq!(setting(&[(CLIENT_KEY_FILE, &not_pem)]), CLIENT_CERT_FILE);
        assert_eq!(setting(&[(NATIVE_ROOTS, "perhaps")]), NATIVE_ROOTS);
    }

    #[test]
    fn pem_round_trips_the_der() {
        let der = webpki_root_certs::TLS_SERVER_ROOT_CERTS[0].clone();
        let pem = to_pem(&der);
        let back: Vec<_> = CertificateDer::pem_slice_iter(pem.as_bytes()).collect::<Result<_, _>>().unwrap();
        assert_eq!(back, vec![der]);
    }

    #[test]
    fn debug_never_prints_key_material() {
        let text = format!("{:?}", load(&[]).unwrap());
        assert!(text.contains("client_certificate: false"), "{text}");
    }
}
