//! TLS test support: a throw-away certificate authority (`rcgen`), a TLS-only Redis (one node, or a
//! three-master cluster) and a throw-away RabbitMQ node with only a TLS listener, each on its own
//! ports, node name and directories and stopped when dropped (the shared services are never
//! touched); and a TLS front that puts HTTPS before a plain test server (a receiver, a model).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use tokio::net::{TcpListener, TcpStream};

use crate::{free_port, wait_for};

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("fleet-test-{what}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A certificate and its key, written as PEM files.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// A private certificate authority of one test.
pub struct TestCa {
    dir: TempDir,
    issuer: Issuer<'static, KeyPair>,
    /// The CA's certificate (PEM): what `FLEET_TLS_CA_FILE` names.
    pub ca_file: PathBuf,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let dir = TempDir::new("tls-ca");
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, format!("{name} test CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).unwrap();
        let ca_file = dir.0.join("ca.pem");
        std::fs::write(&ca_file, cert.pem()).unwrap();
        TestCa { dir, issuer: Issuer::new(params, key), ca_file }
    }

    /// A server certificate for `localhost` and 127.0.0.1 (also good as a client certificate:
    /// Redis Cluster nodes present theirs to each other on the cluster bus).
    pub fn server(&self, name: &str) -> Issued {
        let purposes = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(name, vec!["localhost".into(), "127.0.0.1".into()], purposes)
    }

    /// A client certificate (for mutual TLS).
    pub fn client(&self, name: &str) -> Issued {
        self.issue(name, vec![], vec![ExtendedKeyUsagePurpose::ClientAuth])
    }

    fn issue(&self, name: &str, names: Vec<String>, purposes: Vec<ExtendedKeyUsagePurpose>) -> Issued {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = purposes;
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let issued = Issued {
            cert_file: self.dir.0.join(format!("{name}.pem")),
            key_file: self.dir.0.join(format!("{name}.key")),
        };
        std::fs::write(&issued.cert_file, cert.pem()).unwrap();
        std::fs::write(&issued.key_file, key.serialize_pem()).unwrap();
        issued
    }

    /// The fleet's settings that trust this CA and present `client`.
    pub fn fleet_env(&self, client: &Issued) -> Vec<(String, String)> {
        vec![
            ("FLEET_TLS_CA_FILE".into(), path(&self.ca_file)),
            ("FLEET_TLS_CLIENT_CERT_FILE".into(), path(&client.cert_file)),
            ("FLEET_TLS_CLIENT_KEY_FILE".into(), path(&client.key_file)),
        ]
    }

    /// A redis client configuration that trusts this CA and presents `client`.
    pub fn redis_certificates(&self, client: &Issued) -> redis::TlsCertificates {
        install_crypto_provider();
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: std::fs::read(&client.cert_file).unwrap(),
                client_key: std::fs::read(&client.key_file).unwrap(),
            }),
            root_cert: Some(std::fs::read(&self.ca_file).unwrap()),
        }
    }
}

pub fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// rustls needs a process default when several providers are compiled in (the redis crate uses it).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// TLS-only `redis-server`s (no plaintext port) that require a client certificate from `ca`.
pub struct TlsRedis {
    pub ports: Vec<u16>,
    children: Vec<Child>,
    _dir: TempDir,
}

impl TlsRedis {
    /// One node.
    pub async fn start(ca: &TestCa, client: &Issued) -> Self {
        let redis = Self::spawn(ca, 1, &[]);
        redis.wait_answering(ca, client).await;
        redis
    }

    /// Three masters with `--tls-cluster yes`, every slot assigned, the cluster state `ok`.
    pub async fn start_cluster(ca: &TestCa, client: &Issued) -> Self {
        let redis = Self::spawn(ca, 3, &["--cluster-enabled", "yes", "--tls-cluster", "yes"]);
        redis.wait_answering(ca, client).await;
        let mut create = Command::new("redis-cli");
        create.args(redis.cli_tls_args(ca, client)).args(["--cluster", "create"]);
        for port in &redis.ports {
            create.arg(format!("127.0.0.1:{port}"));
        }
        let out = create.args(["--cluster-yes"]).stdin(Stdio::null()).output().expect("redis-cli on PATH");
        assert!(out.status.success(), "redis-cli --cluster create: {}", String::from_utf8_lossy(&out.stderr));
        for port in redis.ports.clone() {
            let certs = ca.redis_certificates(client);
            wait_for("the TLS cluster's state to be ok", Duration::from_secs(30), || {
                let certs = certs.clone();
                async move {
                    let info: String = redis_query(port, certs, redis::cmd("CLUSTER").arg("INFO")).await?;
                    info.contains("cluster_state:ok").then_some(())
                }
            })
            .await;
        }
        redis
    }

    fn spawn(ca: &TestCa, nodes: usize, extra: &[&str]) -> Self {
        let dir = TempDir::new("tls-redis");
        let server = ca.server("redis-server");
        let mut redis = TlsRedis { ports: vec![], children: vec![], _dir: dir };
        for n in 0..nodes {
            let node_dir = redis._dir.0.join(format!("node{n}"));
            std::fs::create_dir_all(&node_dir).unwrap();
            let port = free_port();
            let child = Command::new("redis-server")
                .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
                .args(["--cluster-port", &free_port().to_string()])
                .arg("--tls-cert-file")
                .arg(&server.cert_file)
                .arg("--tls-key-file")
                .arg(&server.key_file)
                .arg("--tls-ca-cert-file")
                .arg(&ca.ca_file)
                .args(["--tls-auth-clients", "yes", "--tls-replication", "yes"])
                .arg("--dir")
                .arg(&node_dir)
                .args(extra)
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server on PATH");
            redis.ports.push(port);
            redis.children.push(child);
        }
        redis
    }

    fn cli_tls_args(&self, ca: &TestCa, client: &Issued) -> Vec<String> {
        vec![
            "--tls".into(),
            "--cacert".into(),
            path(&ca.ca_file),
            "--cert".into(),
            path(&client.cert_file),
            "--key".into(),
            path(&client.key_file),
        ]
    }

    async fn wait_answering(&self, ca: &TestCa, client: &Issued) {
        for port in self.ports.clone() {
            let certs = ca.redis_certificates(client);
            wait_for("the test's TLS redis-server", Duration::from_secs(15), || {
                let certs = certs.clone();
                async move {
                    let pong: String = redis_query(port, certs, &redis::cmd("PING")).await?;
                    (pong == "PONG").then_some(())
                }
            })
            .await;
        }
    }

    /// `rediss://localhost:PORT/0` (one node), or every cluster node comma-separated.
    pub fn url(&self) -> String {
        if self.ports.len() == 1 {
            format!("rediss://localhost:{}/0", self.ports[0])
        } else {
            self.ports.iter().map(|p| format!("rediss://127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
        }
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One command over TLS to one node; `None` on any failure.
pub async fn redis_query<T: redis::FromRedisValue>(
    port: u16,
    certs: redis::TlsCertificates,
    cmd: &redis::Cmd,
) -> Option<T> {
    let client = redis::Client::build_with_tls(format!("rediss://127.0.0.1:{port}"), certs).ok()?;
    let mut con = client.get_multiplexed_async_connection().await.ok()?;
    cmd.query_async(&mut con).await.ok()
}

/// A throw-away RabbitMQ node (its own node name, ports, Mnesia and log directories, no plugins)
/// listening only on TLS and requiring a client certificate from the test's CA.
pub struct TlsRabbit {
    pub port: u16,
    dist_port: u16,
    node: String,
    dir: TempDir,
}

const RABBITMQ_BIN: &str = "/usr/lib/rabbitmq/bin";

impl TlsRabbit {
    /// Starts the node (`rabbitmq-server -detached`); `wait_ready` waits for its TLS listener.
    pub fn start(ca: &TestCa) -> Self {
        let dir = TempDir::new("tls-rabbit");
        let port = free_port();
        let node = format!("tls-{}@localhost", &uuid::Uuid::new_v4().simple().to_string()[..10]);
        let server = ca.server("rabbit-server");
        let config = format!(
            "listeners.tcp = none\n\
             listeners.ssl.default = 127.0.0.1:{port}\n\
             ssl_options.cacertfile = {ca}\n\
             ssl_options.certfile = {cert}\n\
             ssl_options.keyfile = {key}\n\
             ssl_options.verify = verify_peer\n\
             ssl_options.fail_if_no_peer_cert = true\n\
             loopback_users = none\n",
            ca = path(&ca.ca_file),
            cert = path(&server.cert_file),
            key = path(&server.key_file),
        );
        std::fs::write(dir.0.join("rabbitmq.conf"), config).unwrap();
        std::fs::write(dir.0.join("rabbitmq-env.conf"), "").unwrap();
        std::fs::write(dir.0.join("enabled_plugins"), "[].\n").unwrap();
        let rabbit = TlsRabbit { port, dist_port: free_port(), node, dir };
        let status = rabbit.command("rabbitmq-server").arg("-detached").status().expect("rabbitmq-server");
        assert!(status.success(), "rabbitmq-server -detached: {status}");
        rabbit
    }

    /// The node's own environment: nothing of the shared node's (`/etc/rabbitmq`, its cookie, its
    /// data) is read or written.
    fn command(&self, bin: &str) -> Command {
        let d = &self.dir.0;
        let mut cmd = Command::new(format!("{RABBITMQ_BIN}/{bin}"));
        cmd.env("HOME", d)
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_CONF_ENV_FILE", d.join("rabbitmq-env.conf"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_PID_FILE", d.join("rabbit.pid"))
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    }

    /// `amqps://guest:guest@localhost:PORT/%2f`
    pub fn url(&self) -> String {
        format!("amqps://guest:guest@localhost:{}/%2f", self.port)
    }

    /// Waits until an AMQP connection over TLS (with `tls`, the fleet's own client) opens.
    pub async fn wait_ready(&self, tls: &fleet_platform::tls::ClientTls) {
        let url = self.url();
        wait_for(&format!("RabbitMQ node {} on TLS port {}", self.node, self.port), Duration::from_secs(90), || {
            let url = url.clone();
            async move {
                let conn = fleet_platform::broker::connect_one(&url, tls).await.ok()?;
                let _ = conn.close(200, "ready".into()).await;
                Some(())
            }
        })
        .await;
    }
}

impl Drop for TlsRabbit {
    fn drop(&mut self) {
        // With the pid file, `stop` returns only once the node's process has exited, so its
        // directory is not removed under a node still shutting down.
        let pid_file = self.dir.0.join("rabbit.pid");
        let pid = std::fs::read_to_string(&pid_file).ok().and_then(|p| p.trim().parse::<i32>().ok());
        let _ = self.command("rabbitmqctl").args(["-n", &self.node, "stop"]).arg(&pid_file).status();
        if let Some(pid) = pid {
            // SAFETY: kill(2) on the node this test started (signal 0 only checks it exists).
            if unsafe { libc::kill(pid, 0) } == 0 {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// HTTPS in front of a plain local server: TLS is terminated with `server`'s certificate and the
/// bytes are forwarded to `upstream`.
pub struct TlsFront {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl TlsFront {
    pub async fn start(upstream: SocketAddr, server: &Issued) -> Self {
        install_crypto_provider();
        use rustls::pki_types::pem::PemObject;
        let chain = rustls::pki_types::CertificateDer::pem_file_iter(&server.cert_file)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&server.key_file).unwrap();
        let config = rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(chain, key).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else { return };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(inbound).await else { return };
                    let Ok(mut plain) = TcpStream::connect(upstream).await else { return };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        TlsFront { addr, task }
    }

    /// `https://localhost:PORT{path}`
    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.addr.port())
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}
