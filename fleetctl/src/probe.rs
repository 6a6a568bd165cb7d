//! `fleetctl probe`: a container's health check without curl in the image. GETs a fleet process's
//! `/readyz` (or `--path`) on this host and exits 0 on a 2xx answer, 1 otherwise: the exit codes a
//! Docker or Podman `HEALTHCHECK` reads. The image's check is `fleetctl probe` with no target, which
//! probes the process the container runs, so one image serves the dispatcher and the workers.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use fleet_platform::config::{socket_addr, Source};

/// The listen setting and its default of each process, as `dispatcher/src/config.rs` and
/// `worker/src/config.rs` read them.
const DISPATCHER: (&str, &str) = ("FLEET_HTTP_ADDR", "127.0.0.1:8080");
const WORKER: (&str, &str) = ("FLEET_WORKER_HTTP_ADDR", "127.0.0.1:9090");

#[derive(clap::Args)]
pub struct ProbeArgs {
    /// `dispatcher`, `worker` (probed at the address its FLEET_HTTP_ADDR / FLEET_WORKER_HTTP_ADDR
    /// listens on) or a whole URL. Default: the process this container runs (its PID 1).
    target: Option<String>,
    /// Path probed on a dispatcher or worker: /readyz (readiness) or /healthz (liveness).
    #[arg(long, default_value = "/readyz")]
    path: String,
    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 2.0)]
    timeout: f64,
}

pub async fn run(src: &Source, args: ProbeArgs) -> anyhow::Result<()> {
    let url = url(src, args.target.as_deref(), &args.path, pid1_program)?;
    // A health check answers itself: a redirect is a failed probe, never followed elsewhere.
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs_f64(args.timeout.max(0.001)))
        .build()?;
    let status = client.get(&url).send().await.with_context(|| format!("GET {url}"))?.status();
    anyhow::ensure!(status.is_success(), "GET {url}: {status}");
    println!("GET {url}: {status}");
    Ok(())
}

/// The URL to probe; `pid1` names the program this container runs, asked only without a target.
fn url(
    src: &Source,
    target: Option<&str>,
    path: &str,
    pid1: impl FnOnce() -> Option<String>,
) -> anyhow::Result<String> {
    let target = match target {
        Some(t) if t.starts_with("http://") || t.starts_with("https://") => return Ok(t.to_string()),
        Some(t) => t.to_string(),
        None => match pid1() {
            Some(program) if program == "dispatcher" || program == "worker" => program,
            other => anyhow::bail!(
                "cannot tell which fleet process to probe (PID 1 runs {}): name it, \
                 `fleetctl probe dispatcher`, `fleetctl probe worker` or `fleetctl probe URL`",
                other.as_deref().unwrap_or("an unreadable program")
            ),
        },
    };
    let (setting, default) = match target.as_str() {
        "dispatcher" => DISPATCHER,
        "worker" => WORKER,
        other => anyhow::bail!("unknown probe target {other:?}: dispatcher, worker or an http:// URL"),
    };
    let addr = reachable(socket_addr(src, setting, default)?);
    Ok(format!("http://{addr}{path}"))
}

/// A wildcard listen address is probed on the loopback address of its family.
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port()),
        _ => addr,
    }
}

/// The program PID 1 runs (the file name of its argv[0]): in a container, the fleet process.
fn pid1_program() -> Option<String> {
    program_of(&std::fs::read("/proc/1/cmdline").ok()?)
}

fn program_of(cmdline: &[u8]) -> Option<String> {
    let argv0 = std::str::from_utf8(cmdline.split(|b| *b == 0).next()?).ok()?;
    Some(Path::new(argv0).file_name()?.to_str()?.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn url_of(pairs: &[(&str, &str)], target: Option<&str>, pid1: Option<&str>) -> anyhow::Result<String> {
        url(&Source::from_pairs(pairs.iter().copied()), target, "/readyz", || pid1.map(str::to_string))
    }

    #[test]
    fn targets_resolve_to_the_address_each_process_listens_on() {
        assert_eq!(url_of(&[], Some("dispatcher"), None).unwrap(), "http://127.0.0.1:8080/readyz");
        assert_eq!(url_of(&[], Some("worker"), None).unwrap(), "http://127.0.0.1:9090/readyz");
        let image_env = [("FLEET_HTTP_ADDR", "0.0.0.0:8080"), ("FLEET_WORKER_HTTP_ADDR", "[::]:9091")];
        assert_eq!(url_of(&image_env, Some("dispatcher"), None).unwrap(), "http://127.0.0.1:8080/readyz");
        assert_eq!(url_of(&image_env, Some("worker"), None).unwrap(), "http://[::1]:9091/readyz");
        let url = "http://10.0.0.1:1/healthz";
        assert_eq!(url_of(&image_env, Some(url), None).unwrap(), url);
        assert!(url_of(&[("FLEET_HTTP_ADDR", "localhost")], Some("dispatcher"), None).is_err());
        assert!(url_of(&[], Some("broker"), None).unwrap_err().to_string().contains("unknown probe target"));
    }

    #[test]
    fn without_a_target_the_container_s_own_process_is_probed() {
        let env = [("FLEET_HTTP_ADDR", "127.0.0.1:7001"), ("FLEET_WORKER_HTTP_ADDR", "127.0.0.1:7002")];
        assert_eq!(url_of(&env, None, Some("worker")).unwrap(), "http://127.0.0.1:7002/readyz");
        assert_eq!(url_of(&env, None, Some("dispatcher")).unwrap(), "http://127.0.0.1:7001/readyz");
        let err = url_of(&env, None, Some("tini")).unwrap_err().to_string();
        assert!(err.contains("PID 1 runs tini") && err.contains("fleetctl probe worker"), "{err}");
        assert_eq!(program_of(b"/usr/local/bin/worker\0--flag\0").as_deref(), Some("worker"));
        assert_eq!(program_of(b"dispatcher").as_deref(), Some("dispatcher"));
    }

    /// One HTTP answer with `status` to the first request on a loopback port.
    async fn answer_once(status: &'static str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = socket.read(&mut request).await;
            let response = format!("HTTP/1.1 {status}\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
            socket.write_all(response.as_bytes()).await.unwrap();
        });
        format!("http://{addr}/readyz")
    }

    fn args(target: String) -> ProbeArgs {
        ProbeArgs { target: Some(target), path: "/readyz".into(), timeout: 2.0 }
    }

    #[tokio::test]
    async fn a_2xx_passes_and_anything_else_fails() {
        let src = Source::default();
        run(&src, args(answer_once("200 OK").await)).await.unwrap();
        let err = run(&src, args(answer_once("503 Service Unavailable").await)).await.unwrap_err();
        assert!(err.to_string().contains("503"), "{err}");
        let closed = format!("http://127.0.0.1:{}/readyz", {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        });
        assert!(run(&src, args(closed)).await.is_err(), "nothing listening fails the probe");
    }
}
