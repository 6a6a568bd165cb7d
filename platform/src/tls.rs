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

use crate::source::{ConfigError, Source};

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
            (Some(_), None) => {
                return Err(ConfigError::new(CLIENT_KEY_FILE, "is required with FLEET_TLS_CLIENT_CERT_FILE"))
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(CLIENT_CERT_FILE, "is required with FLEET_TLS_CLIENT_KEY_FILE"))
            }
            (Some(cert), Some(key)) => {
                Some(parse_identity(read(CLIENT_CERT_FILE, cert)?, read(CLIENT_KEY_FILE, key)?)?)
            }
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
            client_tls: self
                .material
                .identity
                .as_ref()
                .map(|id| redis::ClientTlsConfig { client_cert: id.cert_pem.clone(), client_key: id.key_pem.clone() }),
            root_cert: Some(root_pem.into_bytes()),
        }
    }
}

/// Which side refused a TLS handshake over a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// This process did not accept the server's certificate (unknown CA, wrong name, expired).
    ServerUntrusted,
    /// The server refused this process's client certificate, or wanted one.
    ClientRefused,
}

impl Rejection {
    /// The setting that decides it.
    pub fn setting(self) -> &'static str {
        match self {
            Rejection::ServerUntrusted => CA_FILE,
            Rejection::ClientRefused => CLIENT_CERT_FILE,
        }
    }

    fn advice(self) -> &'static str {
        match self {
            Rejection::ServerUntrusted => {
                "the server's certificate is not trusted: set FLEET_TLS_CA_FILE to its CA bundle, or FLEET_TLS_NATIVE_ROOTS=true"
            }
            Rejection::ClientRefused => {
                "the server refused the client certificate: set FLEET_TLS_CLIENT_CERT_FILE and FLEET_TLS_CLIENT_KEY_FILE to one it accepts"
            }
        }
    }
}

/// rustls's own words for a certificate either side refused (its `Display`), and whose it was.
const REJECTION_SIGNS: [(&str, Rejection); 6] = [
    ("invalid peer certificate", Rejection::ServerUntrusted),
    ("received fatal alert: CertificateRequired", Rejection::ClientRefused),
    ("received fatal alert: BadCertificate", Rejection::ClientRefused),
    ("received fatal alert: UnknownCA", Rejection::ClientRefused),
    ("received fatal alert: CertificateUnknown", Rejection::ClientRefused),
    ("received fatal alert: UnsupportedCertificate", Rejection::ClientRefused),
];

/// Whether an error's text (its whole chain) says a certificate was refused, and the phrase that
/// says so. Text, not types: the redis and lapin crates wrap rustls's error in ways that hide it
/// from downcasting, but every layer keeps its message.
pub fn rejection_in(text: &str) -> Option<(Rejection, String)> {
    REJECTION_SIGNS.iter().find_map(|(sign, rejection)| {
        let at = text.find(sign)?;
        let phrase: String =
            text[at..].chars().take_while(|c| !matches!(c, '\n' | ')' | ';' | '|')).take(120).collect();
        Some((*rejection, phrase.trim_end_matches([',', ' ']).to_string()))
    })
}

/// The text of an error and every source below it.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(" | ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// What to check when a connection failed with `error` (text): set when a certificate was refused,
/// so the log line names the settings that decide it.
pub fn untrusted_hint(error: &str) -> Option<&'static str> {
    rejection_in(error).map(|(rejection, _)| rejection.advice())
}

/// At start, one TLS handshake with every TLS endpoint (each `amqps://` broker, each `rediss://`
/// node): a certificate either side refuses stops the process with one line naming the setting,
/// instead of a process that stays unready retrying a handshake that cannot succeed. An endpoint
/// that is only unreachable or slow is no error: the process starts and keeps trying, as without TLS.
pub async fn startup_check(amqp_urls: &[String], redis_url: &str, tls: &ClientTls) -> Result<(), ConfigError> {
    let amqp = amqp_urls.iter().filter(|u| u.starts_with("amqps://")).map(|u| ("RabbitMQ", u.as_str(), 5671));
    let redis = redis_url.split(',').map(str::trim).filter(|u| u.starts_with("rediss://"));
    let endpoints: Vec<_> = amqp.chain(redis.map(|u| ("Redis", u, 6379))).collect();
    let probes = endpoints.iter().map(|(service, url, default_port)| async move {
        let Some((host, port)) = host_and_port(url, *default_port) else { return Ok(()) };
        match tokio::time::timeout(STARTUP_PROBE, handshake(&host, port, tls)).await {
            Ok(Some((rejection, detail))) => Err(ConfigError::new(
                rejection.setting(),
                format!("{service} at {host}:{port}: {detail}; {}", rejection.advice()),
            )),
            Ok(None) | Err(_) => Ok(()),
        }
    });
    futures::future::join_all(probes).await.into_iter().collect()
}

/// How long the start-up check gives one endpoint.
const STARTUP_PROBE: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a completed handshake waits for the server's verdict on the client certificate: in
/// TLS 1.3 the server checks it after the client has finished, and answers a refusal with an alert.
const CLIENT_VERDICT_WAIT: std::time::Duration = std::time::Duration::from_millis(750);

/// A handshake with the service configuration, sending nothing after it (so a refusal's alert is
/// read, not lost to a reset). `Some` when a certificate was refused; `None` otherwise, also when
/// the endpoint cannot be reached, which is no configuration error.
async fn handshake(host: &str, port: u16, tls: &ClientTls) -> Option<(Rejection, String)> {
    use tokio::io::AsyncReadExt;
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).ok()?;
    let tcp = tokio::net::TcpStream::connect((host, port)).await.ok()?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls.service_config()));
    let mut stream = match connector.connect(name, tcp).await {
        Ok(stream) => stream,
        Err(e) => return rejection_of(&e),
    };
    let mut byte = [0u8; 1];
    match tokio::time::timeout(CLIENT_VERDICT_WAIT, stream.read(&mut byte)).await {
        Ok(Err(e)) => rejection_of(&e),
        _ => None,
    }
}

/// A rustls error inside an I/O error, read as a certificate refusal.
fn rejection_of(e: &std::io::Error) -> Option<(Rejection, String)> {
    use rustls::AlertDescription as Alert;
    let tls = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    let rejection = match tls {
        rustls::Error::InvalidCertificate(_) => Rejection::ServerUntrusted,
        rustls::Error::AlertReceived(
            Alert::CertificateRequired
            | Alert::BadCertificate
            | Alert::UnknownCA
            | Alert::CertificateUnknown
            | Alert::UnsupportedCertificate
            | Alert::CertificateExpired
            | Alert::CertificateRevoked,
        ) => Rejection::ClientRefused,
        _ => return None,
    };
    Some((rejection, tls.to_string()))
}

/// Host and port of a URL (never its credentials).
fn host_and_port(url: &str, default_port: u16) -> Option<(String, u16)> {
    let parsed = url::Url::parse(url).ok()?;
    let host = parsed.host_str()?.trim_start_matches('[').trim_end_matches(']').to_string();
    Some((host, parsed.port().unwrap_or(default_port)))
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
    fn refused_certificates_are_told_apart_and_named() {
        let (who, phrase) = rejection_in("broker error: io error: invalid peer certificate: UnknownIssuer").unwrap();
        assert_eq!((who, phrase.as_str()), (Rejection::ServerUntrusted, "invalid peer certificate: UnknownIssuer"));
        let (who, _) = rejection_in("redis unavailable: received fatal alert: CertificateRequired | x").unwrap();
        assert_eq!(who.setting(), CLIENT_CERT_FILE);
        assert_eq!(rejection_in("Connection refused (os error 111)"), None);
        assert!(untrusted_hint("invalid peer certificate: NotValidForName").unwrap().contains(CA_FILE));
        assert_eq!(untrusted_hint("connection refused"), None);
    }

    #[test]
    fn refusals_are_read_from_the_rustls_error() {
        let io = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let untrusted = io(rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer));
        assert_eq!(rejection_of(&untrusted).unwrap().0.setting(), CA_FILE);
        let refused = io(rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired));
        assert_eq!(rejection_of(&refused).unwrap().0.setting(), CLIENT_CERT_FILE);
        assert_eq!(rejection_of(&io(rustls::Error::AlertReceived(rustls::AlertDescription::ProtocolVersion))), None);
        assert_eq!(rejection_of(&std::io::Error::from(std::io::ErrorKind::ConnectionReset)), None);
    }

    #[test]
    fn endpoints_are_host_and_port_only() {
        assert_eq!(host_and_port("amqps://u:hunter2@mq.example/%2f", 5671), Some(("mq.example".into(), 5671)));
        assert_eq!(host_and_port("rediss://:pw@[::1]:6380/0", 6379), Some(("::1".into(), 6380)));
    }

    #[test]
    fn debug_never_prints_key_material() {
        let text = format!("{:?}", load(&[]).unwrap());
        assert!(text.contains("client_certificate: false"), "{text}");
    }
}
